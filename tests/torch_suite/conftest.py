"""tests/torch_suite holds harnesses run by hand (torch's DistributedTest driver), never by the
project's pytest run."""
collect_ignore_glob = ["*.py"]
