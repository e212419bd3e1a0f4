"""The measurement harness behind tools/benchmark.py, tools/device_check.py and
tools/kernel_rule_cost.py: the one comparison loop (``runner``), what it compares (``backbone``,
``v2``, ``detector``, ``exports``), the exact work counter (``work``), the console table and the
report (``format``, ``report``) and the accelerator check (``device_check``).

It sits beside ``swin_rpe_plugin`` and is not installed with it: it measures the package from a
clone in the pinned environment (mmdet, transformers, ONNX runtimes as the baselines), while the
installed package holds only what users import. Tools put the repository root on ``sys.path``.
"""
