"""Compiled drivers for the bench's peers that have no Python binding on PyPI: oneCCL
(``oneccl.cpp``) and Intel MPI (``impi.cpp``), both behind one C ABI (``driver.h``).

``locate`` finds each library's files by explicit path (checked against its package's record),
``build`` compiles a driver on first use and caches it, ``runner`` is the bench runner over it,
``worker`` is one rank of a launcher-started phase. Installed by ``pip install 'ringcomm[peers]'``.
"""
