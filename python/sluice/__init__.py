"""sluice: files and datasets into GPU (or host) memory at the speed of the hardware.

The package's modules, re-exported here: buffers (the engine, memory, read/write and their async forms), dataset,
loader, images (Images: decoding and augmentation in the loader), s3 (Client, copy), packer (pack, Packer), checkpoint (save, load), models (from_pretrained, load_model, empty_weights), operate (metrics, process checkpoints).
The Data Journey's experiments and the peers they run (torch, Streaming, WebDataset) are a tool beside the package
(tools/journey), run by `sluice journey`: nothing here imports them.

Arrays: numpy arrays for host memory; any object with __cuda_array_interface__ (torch CUDA tensors, CuPy
arrays) or DLPack (__dlpack__: JAX, TensorFlow, ...) for GPU or host memory.  Errors from the C library arrive as sluice.SluiceError carrying its detail.
"""
from ._lib import SluiceError, lib  # noqa: F401
from .buffers import (Future, _buffer, _eng, gpu_count, read, read_async, read_broadcast, read_to_gpu,  # noqa: F401
                      write, write_async, write_from_gpu)
from .dataset import Dataset  # noqa: F401
from .loader import Loader  # noqa: F401
from .profiler import profile  # noqa: F401
from .images import IMAGENET_MEAN, IMAGENET_STD, Images  # noqa: F401
from .operate import checkpoint_process, metrics_text, serve_metrics  # noqa: F401
from .packer import Packer, pack  # noqa: F401
from .s3 import Client, ObjectFolder, copy, listdir, remove  # noqa: F401
from .checkpoint import load, save  # noqa: F401,E402
from .models import empty_weights, from_pretrained, load_model  # noqa: F401,E402
from .tfrecord import tf_example  # noqa: F401,E402

__all__ = ["SluiceError", "read", "read_to_gpu", "write", "write_from_gpu", "read_async", "write_async", "Future",
           "read_broadcast", "gpu_count", "Dataset", "Loader", "Images", "IMAGENET_MEAN", "IMAGENET_STD", "profile", "pack", "Packer", "Client", "ObjectFolder",
           "copy", "listdir", "remove", "save", "load", "from_pretrained", "load_model", "empty_weights", "metrics_text", "serve_metrics", "checkpoint_process",
           "tf_example"]
