"""Images decoded and augmented inside the loader: the pipeline a torchvision user writes, in one object."""
import ctypes as C
import math

from ._lib import ImageBox, ImageOptions, check, lib
from .dataset import _NAMES, _int_option

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

_MODES = {"random_resized_crop": 0, "center_crop": 1, "resize": 2}
_DECODE = {"auto": 0, "gpu": 1, "cpu": 2}
_DTYPES = {"u8": "u8", "uint8": "u8", "f16": "f16", "float16": "f16", "bf16": "bf16", "bfloat16": "bf16",
           "f32": "f32", "float32": "f32"}


class Images:
    """One field's encoded images (JPEG, PNG, WebP) as a batch tensor ready for the model.

        sluice.Loader(ds, batch_size=256, device="cuda",
                      images=sluice.Images("data", size=224, flip=0.5, mean=sluice.IMAGENET_MEAN,
                                           std=sluice.IMAGENET_STD, dtype="bf16", channels_last=True))

    is, per image, torchvision's RandomResizedCrop(224, scale, ratio) (the same sampling), RandomHorizontalFlip(0.5),
    ToDtype(scale=True) and Normalize(mean, std), with the resize bilinear and antialiased, as torchvision's; the
    batch's field is then a tensor [B, 3, size, size] (channels_last: the same shape in channels-last memory).
    mode "center_crop" is Resize(resize) then CenterCrop(size), for evaluation (resize: default the larger side of
    size * 8 / 7, at most 16384);
    "resize" resizes whole images to size.  size: an int or (height, width).  dtype: "u8" (not normalised), "f16",
    "bf16" or "f32".  decode: "auto" (nvJPEG with a GPU loader, its hardware decoders where the GPU has them; the CPU's
    threads for PNG, WebP, progressive, CMYK and RGB-stored JPEGs, and where it is missing), "gpu" (nvJPEG, or fail),
    "cpu".  Pixels are what PIL's convert("RGB") gives (PNG alpha dropped, no gamma; 16-bit colour by the high byte,
    16-bit grey clipped to 255, as PIL's I;16 is).  Crops and flips
    are a function of the loader's seed, the epoch and the record alone.  A record that is not a whole image fails
    its batch naming the record, or with the loader's skip_corrupt is left out and counted.
    """

    def __init__(self, field="data", size=224, mode="random_resized_crop", scale=(0.08, 1.0),
                 ratio=(3.0 / 4.0, 4.0 / 3.0), flip=0.0, mean=None, std=None, dtype="f32", channels_last=False,
                 decode="auto", resize=None):
        if not isinstance(field, str) or not field or "\0" in field:
            raise TypeError(f"Images(field={field!r}): the name of a bytes field, a non-empty str")
        if isinstance(size, bool) or not isinstance(size, (int, tuple, list)):
            raise TypeError(f"Images(size={size!r}): an int or (height, width)")
        h, w = (size, size) if isinstance(size, int) else tuple(size)
        h, w = _int_option("Images", "size", h, 1, 16384), _int_option("Images", "size", w, 1, 16384)
        resize = _int_option("Images", "resize", resize or 0, 0, 16384)
        if mode not in _MODES:
            raise ValueError(f"Images(mode={mode!r}): one of {sorted(_MODES)}")
        if decode not in _DECODE:
            raise ValueError(f"Images(decode={decode!r}): one of {sorted(_DECODE)}")
        if dtype not in _DTYPES:
            raise ValueError(f"Images(dtype={dtype!r}): one of u8, f16, bf16, f32")
        if (mean is None) != (std is None):
            raise ValueError("Images: mean and std go together (both, or neither)")
        for name, v in (("scale", scale), ("ratio", ratio)):
            if len(v) != 2 or not all(math.isfinite(x) and x > 0 for x in v):
                raise ValueError(f"Images({name}={v!r}): two finite numbers above 0")
        if not 0 <= flip <= 1:
            raise ValueError(f"Images(flip={flip!r}): a probability, 0 to 1")
        self.field, self.size, self.dtype, self.channels_last = field, (h, w), _DTYPES[dtype], bool(channels_last)
        self.decode = decode
        self._field = field.encode()
        o = ImageOptions(field=self._field, height=h, width=w, mode=_MODES[mode], flip=flip,
                         dtype=_NAMES.index(self.dtype), channels_last=int(bool(channels_last)),
                         decode=_DECODE[decode], resize=resize)
        o.scale[:] = scale
        o.ratio[:] = ratio
        if mean is not None:
            if len(mean) != 3 or len(std) != 3:
                raise ValueError("Images: mean and std take 3 values (R, G, B)")
            if not all(math.isfinite(x) for x in mean) or not all(math.isfinite(x) and x > 0 for x in std):
                raise ValueError(f"Images(mean={mean!r}, std={std!r}): finite numbers, each std above 0")
            o.mean[:] = mean
            o.std[:] = std
        self._opt = o

    def plan(self, width, height, record, seed=0, epoch=0):
        """What the loader does to record `record`'s image of width x height in `epoch` under `seed`: a dict of the
        region resized (x, y, w, h), the size it is resized to (resized_w, resized_h), the window taken of that
        (offset_x, offset_y) and flip."""
        box = ImageBox()
        u32, u64 = (1, (1 << 32) - 1), (0, (1 << 64) - 1)
        check(lib.sluice_image_plan(C.byref(self._opt), _int_option("Images.plan", "seed", seed, *u64),
                                    _int_option("Images.plan", "epoch", epoch, *u64),
                                    _int_option("Images.plan", "record", record, *u64),
                                    _int_option("Images.plan", "width", width, *u32),
                                    _int_option("Images.plan", "height", height, *u32), C.byref(box)))
        return {k: getattr(box, k) for k, _ in ImageBox._fields_}

    def _pointer(self):
        return C.pointer(self._opt)

    def __repr__(self):
        return f"sluice.Images({self.field!r}, size={self.size}, dtype={self.dtype!r})"
