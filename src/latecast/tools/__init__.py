"""The tools built on everything else: the command line (``cli``), ``bench`` and
``profile`` (``profiling``). Nothing else in the package imports them."""
