"""The kernels' C++/CUDA sources. Installed inside the package as `hal.csrc`, so that hal.jit
finds them through importlib.resources wherever moe-hal is installed (wheel or editable)."""
