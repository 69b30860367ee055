"""The applications beside the bench (``ringcomm.bench``): train and its report
(``ringcomm-train``), simulate, tune (the machine profile of the cost model), the demos (demo,
parallel_demo) and their model (tiny_lm). They may import every layer below.
"""
