from .kernel import CompiledKernel, KernelHangError

__all__ = ["CompiledKernel", "KernelHangError"]
