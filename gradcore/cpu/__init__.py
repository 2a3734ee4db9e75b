"""The CPU backend's native libraries beside the NumPy kernels: oneDNN
(``gradcore.cpu.onednn``) for the convolutions, pooling and batch norm."""
