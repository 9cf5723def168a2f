"""Models ready on the GPU straight from a checkpoint.

from_pretrained: a transformers model from a directory (or an s3:// or http(s):// prefix) that holds its
config.json and safetensors weights.  The model is built with its parameters on the meta device (no memory, no
initialisation), the checkpoint is read as one batched read into one buffer on the device, and its tensors
become the parameters where they landed: no copy, tied weights one tensor.  load_model does the same for any
torch module built without weights (empty_weights() here, or accelerate's init_empty_weights()).
"""
import errno
import inspect
import json
import logging
import math
import os
import re
import tempfile
from collections import namedtuple
from contextlib import contextmanager, nullcontext

from ._lib import SluiceError, shown
from ._safetensors import DT, bad, is_remote, parse_json, read_small
from .checkpoint import _Open, _join, _listed, _load_from, _named, _sources


@contextmanager
def empty_weights():
    """Modules built inside get their parameters on the meta device: no memory and no initialisation.  Their
    buffers are made as usual: a model computes some (rotary frequencies) that checkpoints do not hold.
    It swaps torch.nn.Module.register_parameter for the whole process while it is open, as accelerate's
    init_empty_weights does: build one model at a time, in one thread.  A module whose __init__ computes a buffer
    from its parameters gets the value computed from meta tensors: none (load_model refuses such a buffer where
    it is left on the meta device)."""
    import torch
    register = torch.nn.Module.register_parameter

    def on_meta(module, name, param):
        register(module, name, param)
        if param is not None and param.device.type != "meta":
            module._parameters[name] = _like(param, param.to("meta"))

    torch.nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def _like(param, value):
    """A parameter like param (its class, its attributes and requires_grad) holding value."""
    p = type(param)(value, requires_grad=param.requires_grad)
    p.__dict__.update(vars(param))
    return p


_CONFIG_MAX = 16 << 20  # the most a config.json may hold
_MODEL_DTYPES = ("float16", "bfloat16", "float32", "float64")


def _torch_dtype(torch, dtype):
    """dtype (a torch dtype, its name, or None) as a floating torch dtype, or None."""
    if isinstance(dtype, str) and isinstance(getattr(torch, dtype, None), torch.dtype):
        dtype = getattr(torch, dtype)
    if dtype is None or (isinstance(dtype, torch.dtype) and str(dtype).replace("torch.", "") in _MODEL_DTYPES):
        return dtype
    raise ValueError(f"sluice: dtype={dtype!r} is not a model's floating dtype (one of {', '.join(_MODEL_DTYPES)}, "
                     f"as torch.bfloat16 or 'bfloat16')")


def _key_map(names, table, prefix):
    """The checkpoint's name for each of the model's names, decided once for the whole checkpoint as transformers
    decides it: the same; or, where the model's names have the base model's prefix and the checkpoint's have
    none (a base model's checkpoint into a model with a head), without it; or, the other way round, with it."""
    p = prefix + "."
    if prefix and any(n.startswith(p) for n in names) and not any(k.startswith(p) for k in table):
        return lambda n: n[len(p):] if n.startswith(p) else n
    if prefix and any(k.startswith(p) for k in table) and not any(n.startswith(p) for n in names):
        return lambda n: p + n
    return lambda n: n


def _fits(torch, have, shape, t, want):
    """Whether a stored tensor of dtype have and shape can become the model's t (want: its dtype): the same
    shape, and the same dtype or two floating ones a conversion joins (not the packed float4)."""
    if have is None or tuple(shape) != tuple(t.shape):
        return False
    packed = getattr(torch, "float4_e2m1fn_x2", None)
    return have == want or (have.is_floating_point and want.is_floating_point and packed not in (have, want))


def _stored(torch, entry):
    """(torch dtype or None, shape as load delivers it) of a listing's (dtype, shape)."""
    dt, shape = entry
    name = DT[dt][1]
    return (getattr(torch, name, None) if name else None), ((*shape[:-1], shape[-1] // 2) if dt == "F4" and shape
                                                             else tuple(shape))


def _plan(torch, model, table, dtype, source, rules):
    """(plan, missing, used): for each of the module's state_dict tensors (tied ones once, with every name), the
    tensor, its names, the checkpoint names that hold it and the dtype it is to have; the names the checkpoint
    lacks (as torch's load_state_dict counts them: every state_dict name, persistent buffers too, except that a
    tied tensor the checkpoint holds under one of its names lacks none); the checkpoint names read.  A stored
    tensor that cannot become the module's is a ValueError naming it."""
    state = model.state_dict(keep_vars=True)
    key = _key_map(list(state), table, getattr(model, "base_model_prefix", "") or "")
    groups = {}
    for name, t in state.items():
        groups.setdefault(id(t), (t, []))[1].append(name)
    plan, missing, used = [], [], set()
    for t, names in groups.values():
        mapped = {n: key(n) for n in names}
        keys = list(dict.fromkeys(k for k in mapped.values() if k in table))
        want = dtype if dtype is not None and t.is_floating_point() else t.dtype
        for k in keys:
            if not _fits(torch, *_stored(torch, table[k]), t, want):
                raise ValueError(f"{rules.who}: {_named(source)}: tensor '{k}' is {table[k][0]} "
                                 f"{list(table[k][1])}; the model wants {str(want).replace('torch.', '')} "
                                 f"{list(t.shape)}{rules.about}")
        used.update(keys)
        if not keys:
            missing += names
        plan.append((t, names, keys, want, mapped))
    return plan, missing, used


def _computed(model, state_names, who):
    """{id: (buffer, names)} of the buffers the module made and checkpoints do not hold (non-persistent ones);
    one on the meta device is a ValueError: nothing can give it a value."""
    computed = {}
    for n, b in model.named_buffers(remove_duplicate=False):
        if n not in state_names:
            computed.setdefault(id(b), (b, []))[1].append(n)
    on_meta = [names[0] for b, names in computed.values() if b.device.type == "meta"]
    if on_meta:
        raise ValueError(f"{who}: buffers {', '.join(on_meta[:5])} are on the meta device and no "
                         f"checkpoint holds them: the model computes them, and they were made on the meta device "
                         f"(under torch.device('meta'), or from meta parameters in its __init__). Build the model "
                         f"with its buffers made (sluice.empty_weights() makes only parameters meta), or with its "
                         f"weights and load it with load_state_dict")
    return computed


def _set(model, name, value):
    """value under the module's name (dotted), in the table (parameters or buffers) that holds the name."""
    owner, _, leaf = name.rpartition(".")
    mod = model.get_submodule(owner) if owner else model
    (mod._parameters if leaf in mod._parameters else mod._buffers)[leaf] = value


def _fill(torch, model, t, names, value):
    """value into the module's tensor t, under names: a parameter keeps its object (an optimizer's reference,
    its class and attributes), its contents swapped for value's; a buffer is replaced."""
    if isinstance(t, torch.nn.Parameter):
        torch.utils.swap_tensors(t, _like(t, value))
        value = t
    for n in names:
        _set(model, n, value)


class _Rules(namedtuple("_Rules", "who untie skip_missing skip_unexpected about quiet_unexpected convert",
                        defaults=(None,))):
    """How a load counts and treats the tensors checkpoint and module do not share: torch's load_state_dict's
    (load_model), or those of the transformers from_pretrained mirrors.  who: the function, for messages; untie:
    a tied tensor the checkpoint holds under several names with different values becomes one per name (else it
    stays tied, with the first name's value); skip_missing, skip_unexpected: None, or a test of a name that is
    not to count (the names transformers ignores); about: what the messages add about the model; quiet_unexpected:
    whether unexpected tensors are logged at INFO rather than WARNING where strict=False loads on; convert: None,
    or a callable(torch, model, table) giving the _Conversion of the checkpoint's names to the model's."""


_CONVERT_BATCH = 2 << 30  # bytes of a converted tensor's sources read at once: the rest wait, not the GPU's memory


class _Conversion:
    """The checkpoint's names as the model's, by transformers' own rules for the model (its from_pretrained's
    renames, as GPT-NeoX's embed_out to lm_head, and conversions, as per-expert weights stacked into fused ones):
    table {model's name: (dtype, shape)}, checkpoint names no rule moves keeping theirs (so a name the model lacks
    is named as the checkpoint names it); plain {model's name: checkpoint name}, read into place; groups {model's
    name: (converter, [(pattern, checkpoint name)])}, each made by the converter's own operations of what it
    reads, shapes planned on meta tensors before anything is read."""

    def __init__(self, torch, model, table, renamings, converters, natural):
        from copy import deepcopy
        self.torch, self.model, self._copy = torch, model, deepcopy
        meta = model.state_dict()
        base = getattr(model, "base_model_prefix", None)
        by_pattern = {p: c for c in converters for p in c.source_patterns}
        self.plain, self.groups, self.table = {}, {}, {}
        from transformers.core_model_loading import rename_source_key
        for k in sorted(table, key=natural):
            new, pattern = rename_source_key(k, renamings, converters, base, meta)
            if new not in meta and k in meta:
                new, pattern = k, None
            if new not in meta:
                self.table[k] = table[k]  # unexpected, under its own name
                continue
            other = self.plain.get(new) or (self.groups[new][1][0][1] if new in self.groups else None)
            if other is not None and (pattern is None or new in self.plain):
                # Two stored tensors that are one of the model's (a fused tensor beside its per-expert parts, a
                # name beside its old one): which is meant is not the reader's guess.
                raise ValueError(f"sluice.from_pretrained: tensors '{other}' and '{k}' of the checkpoint are both "
                                 f"the model's '{new}' by transformers' rules for it (which is meant?)")
            if pattern is None:
                self.plain[new] = k
                self.table[new] = table[k]
            else:
                self.groups.setdefault(new, (by_pattern[pattern], []))[1].append((pattern, k))
        self.source = table
        for name in self.groups:
            dts = {table[k][0] for _, k in self.groups[name][1]}
            if len(dts) != 1 or not DT[next(iter(dts))][1]:
                raise ValueError(f"sluice.from_pretrained: {name} is converted from tensors of dtypes "
                                 f"{sorted(dts)}: one dtype torch has is needed")
            (dt,) = dts
            try:  # the shape it will have, planned on meta tensors
                made = self._made(name, lambda k: torch.empty(table[k][1], dtype=getattr(torch, DT[table[k][0]][1]),
                                                              device="meta"))
            except (RuntimeError, ValueError, IndexError) as e:
                parts = self.groups[name][1]
                raise ValueError(f"sluice.from_pretrained: the model's '{name}' cannot be made of the checkpoint's "
                                 f"{len(parts)} tensors transformers' rules make it of ("
                                 + ", ".join(f"'{k}' {list(table[k][1])}" for _, k in parts[:6])
                                 + (f" and {len(parts) - 6} more" if len(parts) > 6 else "")
                                 + f"): {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
            self.table[name] = (dt, tuple(made.shape))

    def _made(self, name, get):
        """The model's tensor name, made by a fresh copy of its converter of get(checkpoint name) of each source."""
        conv, sources = self.groups[name]
        conv = self._copy(conv)
        for pattern, k in sources:
            conv.add_tensor(name, k, pattern, lambda k=k: get(k))
        out = conv.convert(name, model=self.model, config=getattr(self.model, "config", None))
        if set(out) != {name}:
            raise ValueError(f"sluice.from_pretrained: transformers' conversion for {name} makes "
                             f"{_listed(sorted(out))}, not that tensor alone")
        return out[name]

    def keys(self, names):
        """The checkpoint names that the model's names are read from."""
        return sorted({k for n in names for k in ([self.plain[n]] if n in self.plain else
                                                  [k for _, k in self.groups[n][1]] if n in self.groups else [])})

    def read(self, read, names, dev_of):
        """{model's name: tensor} of names, each on its device dev_of[name]: read(checkpoint names, device) ->
        {name: tensor} called once a device for the plain ones and once for each batch of converted ones (their
        sources freed when the batch is made)."""
        plain = [n for n in names if n in self.plain]
        got = _read_each(read, [self.plain[n] for n in plain], {self.plain[n]: dev_of[n] for n in plain}, False)
        out = {n: got[self.plain[n]] for n in plain}
        batch, size = [], 0
        todo = sorted((n for n in names if n in self.groups), key=lambda n: str(dev_of[n]))
        for i, n in enumerate(todo):
            batch.append(n)
            size += sum(math.prod(self.source[k][1]) for _, k in self.groups[n][1])
            if size >= _CONVERT_BATCH or i == len(todo) - 1 or dev_of[todo[i + 1]] != dev_of[n]:
                src = read([k for m in batch for _, k in self.groups[m][1]], dev_of[n])
                for m in batch:
                    out[m] = self._made(m, src.__getitem__)
                del src
                batch, size = [], 0
        return out


def _hf_conversion(torch, model, table):
    """The _Conversion of transformers' rules for the model (transformers 5: its conversion mapping), or None
    where they move no name of the checkpoint."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, dot_natural_key
    except ImportError:
        return None
    mapping = get_model_conversion_mapping(model) or []
    renamings = [m for m in mapping if isinstance(m, WeightRenaming)]
    converters = [m for m in mapping if isinstance(m, WeightConverter)]
    if not mapping:
        return None
    conv = _Conversion(torch, model, table, renamings, converters, dot_natural_key)
    if not conv.groups and all(n == k for n, k in conv.plain.items()):
        return None
    return conv


_TORCH = _Rules("sluice.load_model", True, None, None, "", False)
_log = logging.getLogger("sluice")


def load_model(model, source, device="cuda", dtype=None, strict=True, variant=None, report=None,
               process_group=None):
    """Loads a safetensors checkpoint (any source sluice.load takes) into a torch module and returns the module,
    its parameters and buffers on device.

    The module may be built without weights (empty_weights(), accelerate's init_empty_weights(), or
    torch.device("meta") for a module with no computed buffers).  Every tensor it needs is read as one batched
    read into one buffer on device, and each parameter's contents become a view of that buffer: no per-tensor
    copy, and no memory beyond the checkpoint's bytes where the dtypes match.  Each parameter stays the same
    object (an optimizer already made keeps working; its class and attributes stay).  As the parameters share
    one buffer, torch.save of a single one writes the whole buffer (save a .clone()), and safetensors'
    save_model refuses the model (sluice.save and transformers' save_pretrained save it).
    Names are the module's state_dict() names; a checkpoint of the base model (without base_model_prefix) or
    with the prefix where the module has none fits too, decided once for the whole checkpoint.  Tied parameters
    (one parameter under several names, as lm_head.weight and model.embed_tokens.weight) stay one parameter,
    read from the first name the checkpoint holds; where the checkpoint holds several of its names with
    different values, each name gets its own (report['untied']), as transformers 5 does.  Buffers the module
    computed (not in the checkpoint) move to device and keep their dtype.  Shapes and dtypes are checked before
    anything is read, and each tensor read again after (a checkpoint rewritten in between fails with -ESTALE):
    a mismatch is an error naming the tensor.
    dtype: None keeps each tensor's dtype as the module has it; a floating torch dtype for every floating
    parameter and stored buffer.  A floating tensor stored in another dtype is converted on device after the
    read (one more buffer for it).
    strict: as torch's load_state_dict.  True: a ValueError naming every tensor of the module's state_dict
    (parameters and persistent buffers) the checkpoint lacks and every tensor of the checkpoint the module has
    no place for (a non-persistent buffer is none, as in torch), before anything is read.  False: what both hold
    is loaded; the missing ones keep the values the module made (zeros where they are on the meta device), the
    unexpected ones are not read, and report['missing_keys'] and report['unexpected_keys'] list them (torch
    returns them).  Where sluice counts otherwise than torch: a tied tensor the checkpoint holds under one of its
    names lacks none (transformers saves tied weights once), and the base_model_prefix fit above.
    process_group: a torch.distributed group whose ranks all load the same model, each onto its own device: the
    group reads each byte once and all-gathers it (see sluice.load).
    report (a dict, or None) receives sluice.load's figures and missing_keys, unexpected_keys, untied."""
    return _load(model, source, device, dtype, strict, variant, report, process_group, _TORCH)


def _differences(source, rules, missing, unexpected):
    """The sentence naming what checkpoint and module do not share."""
    said = []
    if missing:
        said.append(f"lacks {len(missing)} of the model's tensors: {_listed(missing, 20)}")
    if unexpected:
        said.append(f"holds {len(unexpected)} the model has no place for: {_listed(unexpected, 20)}")
    return (f"{rules.who}: {_named(source)} " + "; it ".join(said)
            + ((" (transformers' rules for this model rename none of them)" if rules.convert else
                " (transformers renames some checkpoints' names as it loads them: sluice.from_pretrained applies its "
                "rules, load_model takes the names as they are)") if missing and unexpected else "") + rules.about)


def _read_each(read, keys, dev_of, together):
    """{name: tensor} of keys, read(keys of one device, that device) for each device they are placed on; the
    devices' reads at once where together (each its own batched read onto its device), else one after another."""
    groups = {}
    for k in keys:
        groups.setdefault(dev_of[k], []).append(k)
    if len(groups) < 2 or not together:
        return {k: v for dev, ks in groups.items() for k, v in read(ks, dev).items()}
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(len(groups)) as ex:
        parts = list(ex.map(lambda g: read(g[1], g[0]), groups.items()))
    return {k: v for part in parts for k, v in part.items()}


def _load(model, source, device, dtype, strict, variant, report, process_group, rules, ckp=None, placed=None):
    """load_model under rules; ckp: the checkpoint open (an _Open), where the caller has opened it already;
    placed: None (every tensor on device), or {state_dict or buffer name: device} (a device map expanded), the
    tensors of each device read as one batched read onto it, the devices' reads at once."""
    if ckp is None:
        with _Open(_sources(source, variant)) as ckp:
            return _load(model, source, device, dtype, strict, variant, report, process_group, rules, ckp, placed)
    import threading
    import torch
    dtype = _torch_dtype(torch, dtype)
    device = torch.device(device)

    def where(names):
        return torch.device(placed.get(names[0], device)) if placed else device
    if callable(getattr(model, "tie_weights", None)):
        model.tie_weights()  # transformers' ties (accelerate's init_empty_weights makes each name its own)
    table = ckp.listing()
    conv = rules.convert(torch, model, table) if rules.convert else None
    if conv is not None:
        table = conv.table  # the model's names, as transformers renames and converts the checkpoint's
    plan, missing, used = _plan(torch, model, table, dtype, source, rules)
    unexpected = [k for k in table if k not in used]
    if rules.skip_missing:
        missing = [n for n in missing if not rules.skip_missing(n)]
    if rules.skip_unexpected:
        unexpected = [k for k in unexpected if not rules.skip_unexpected(k)]
    if strict and (missing or unexpected):
        raise ValueError(_differences(source, rules, missing, unexpected) + " (strict=False loads what both hold"
                         + (", the missing ones as the model made them, zeros where it made none)" if missing
                            else ")"))
    if rules is not _TORCH and (missing or unexpected):  # strict=False: transformers' warning, at its level
        level = logging.INFO if rules.quiet_unexpected and not missing else logging.WARNING
        _log.log(level, "%s", _differences(source, rules, missing, unexpected))
    computed = _computed(model, {n for _, names, *_ in plan for n in names}, rules.who)
    rep, lock = {}, threading.Lock()

    def read(keys, dev):
        r = {}
        got = _load_from(ckp, source, device=str(dev), keys=keys, report=r, process_group=process_group,
                         variant=variant)
        with lock:
            for f, v in r.items():  # the reads' figures added up
                rep[f] = rep.get(f, 0) + v if isinstance(v, (int, float)) and f != "files" else v
        return got
    dev_of = {k: where(names) for _, names, keys, *_ in plan for k in keys}  # the model's name: its device
    if conv is None:
        got = _read_each(read, sorted(used), dev_of, process_group is None)
    else:
        got = conv.read(read, sorted(used), dev_of)
    for t, names, keys, want, _ in plan:  # what was read against what was checked, before the model changes
        for k in keys:
            v = got.get(k)
            if v is None or not _fits(torch, v.dtype, v.shape, t, want):
                raise SluiceError(-errno.ESTALE, f"{_named(source)}: tensor '{k}' changed between its check and "
                                                 f"its read (now {None if v is None else v.dtype} "
                                                 f"{None if v is None else list(v.shape)})")
    untied = []
    for t, names, keys, want, key in plan:
        if not keys:
            _fill(torch, model, t, names, t.to(where(names), want) if t.device.type != "meta"
                  else torch.zeros(t.shape, dtype=want, device=where(names)))
            continue
        values = {k: got[k].to(want) for k in keys}
        if rules.untie and len(keys) > 1 and not all(torch.equal(values[keys[0]], v) for v in values.values()):
            untied.append(names)  # tied in the model, different in the checkpoint: each name its own
            first = [n for n in names if key[n] == keys[0]]
            _fill(torch, model, t, first, values[keys[0]])
            for n in names:
                if n not in first:
                    v = values.get(key[n], values[keys[0]])
                    _set(model, n, _like(t, v) if isinstance(t, torch.nn.Parameter) else v)
        else:
            _fill(torch, model, t, names, values[keys[0]])
    for b, names in computed.values():
        for n in names:
            _set(model, n, b.to(where([n])))
    if report is not None:
        report.update(rep, missing_keys=missing, unexpected_keys=unexpected, untied=untied)
    return model


# The oldest transformers whose from_pretrained sluice's mirrors (tested against it and the newest): 4.57 is the
# newest for Python 3.9 and what pip picks beside mosaicml-streaming and litdata.
_TRANSFORMERS_MIN = (4, 57)


def _transformers():
    """transformers and its (major, minor); an ImportError of one sentence where it is older than sluice mirrors."""
    import transformers
    m = re.match(r"(\d+)\.(\d+)", transformers.__version__)
    version = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    if version < _TRANSFORMERS_MIN:
        raise ImportError(f"sluice.from_pretrained needs transformers {'.'.join(map(str, _TRANSFORMERS_MIN))} or "
                          f"later (this is {transformers.__version__}): pip install -U transformers")
    return transformers, version


def _short(value, n=80):
    r = repr(value)
    return r if len(r) <= n else r[:n] + "..."


def _why(e):
    """An exception as one line a message can carry."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}{'...' if len(text) > 300 else ''}"


def _refused(path, doc, make, e, what):
    """The error naming config.json and its key that make (a function of config.json's document: transformers
    building a config or a model from it) failed on with e: the first key whose removal makes make succeed (the
    value comes from the class's default then), a key of a nested object named with its parent's; else the first
    whose removal makes it fail otherwise (hidden_size=0 fails one way, and with the default, which the other
    sizes do not divide, another)."""
    def without(d, keys):
        head, *rest = keys
        return {k: (without(v, rest) if rest and k == head else v) for k, v in d.items() if rest or k != head}

    def outcome(d):
        try:
            make(d)
            return None
        except Exception as x:
            return type(x)

    tries, changed = 64, None  # a bound on the builds a diagnosis costs
    for k in doc:
        if k in ("model_type", "architectures", "transformers_version") or tries <= 0:
            continue
        tries -= 1
        got = outcome(without(doc, [k]))
        if got is None:
            sub = doc[k]
            for s in (sub if isinstance(sub, dict) else ()):
                tries -= 1
                if tries > 0 and outcome(without(doc, [k, s])) is None:
                    return bad(path, f"{k}.{s}={_short(sub[s])} is refused by {what} ({_why(e)})")
            return bad(path, f"{k}={_short(sub)} is refused by {what} ({_why(e)})")
        if changed is None and got is not type(e):
            changed = k
    if changed is not None:
        return bad(path, f"{changed}={_short(doc[changed])} is refused by {what} ({_why(e)})")
    return bad(path, f"{what} failed on it ({_why(e)})")


def _from_doc(path, doc, make, what):
    """make(doc), an exception from it the error naming config.json and the key at fault."""
    try:
        return make(doc)
    except Exception as e:
        raise _refused(path, doc, make, e, what) from e


_INT64 = 1 << 63


def _check_types(path, doc, config_class):
    """Refuses (naming config.json and the key) a value of a type the config class's default for it rules out,
    which transformers 4 takes without a word and the model then fails on: not a bool where the default is a
    bool, not a string where it is a string, not a finite number in int64's range (or a list of them, as
    eos_token_id and per-layer sizes are) where it is a number.  null passes: many keys take it."""
    try:
        defaults = {k: p.default for k, p in inspect.signature(config_class.__init__).parameters.items()}
    except (TypeError, ValueError):
        return

    def number(v):
        return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                and -_INT64 <= v < _INT64)

    for k, v in doc.items():
        d = defaults.get(k)
        if v is None or d is None or d is inspect.Parameter.empty:
            continue
        if isinstance(d, bool):
            ok, want = isinstance(v, bool), "true or false"
        elif isinstance(d, (int, float)):
            ok = number(v) or (isinstance(v, list) and all(number(x) for x in v))
            want = "a finite number (or a list of them) within int64's range"
        elif isinstance(d, str):
            ok, want = isinstance(v, str), "a string"
        else:
            continue
        if not ok:
            raise bad(path, f"{k}={_short(v)} is not {want} ({config_class.__name__}'s default is {d!r})")


def _config(source, model_class, kwargs, transformers):
    """(config, config_class, path, doc) of the config.json in source (a directory, or an s3:// or http(s)://
    prefix; read through sluice): the transformers config, its class, the file's name and its document."""
    if not is_remote(source) and not os.path.isdir(source):
        raise ValueError(f"sluice.from_pretrained: {shown(source)} is not a directory (it takes the directory, or "
                         f"the s3:// or http(s):// prefix, that holds config.json and the checkpoint)")
    path = _join(source, "config.json")
    doc = _json_object(path, "a config.json")
    archs = doc.get("architectures")
    if archs is not None and not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        raise bad(path, f"architectures={_short(archs)} is not a list of class names")
    config_class = getattr(model_class, "config_class", None)
    if config_class is None:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
        kind = doc.get("model_type")
        if not isinstance(kind, str) or kind not in CONFIG_MAPPING:
            raise bad(path, f"model_type {_short(kind)} is not one transformers {transformers.__version__} knows "
                            f"(pass model_class=)")
        config_class = CONFIG_MAPPING[kind]
    what = f"transformers {transformers.__version__}'s {config_class.__name__}"
    config = _from_doc(path, doc, lambda d: config_class.from_dict(d, **kwargs), what)
    _check_types(path, doc, config_class)
    return config, config_class, path, doc


def _json_object(path, what):
    """The JSON object of a small file (an error naming it where it is not one)."""
    try:
        doc = parse_json(read_small(path, _CONFIG_MAX, what))
    except ValueError as e:
        raise bad(path, f"not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise bad(path, "not a JSON object")
    return doc


def _keep_fp32(torch, model, dtype):
    """The parameters transformers keeps in float32 at this dtype made float32, still on the meta device: its
    _keep_in_fp32_modules at float16 (T5's wo), its _keep_in_fp32_modules_strict at float16 and bfloat16, each a
    module name matched whole within the parameter's name, as transformers 4 and 5 both match them."""
    kept = set(getattr(model, "_keep_in_fp32_modules", None) or ()) if dtype == torch.float16 else set()
    if dtype in (torch.float16, torch.bfloat16):
        kept |= set(getattr(model, "_keep_in_fp32_modules_strict", None) or ())
    for name, p in model.named_parameters():
        if any(f".{m}." in f".{name}." for m in kept) and p.is_meta and p.is_floating_point():
            torch.utils.swap_tensors(p, _like(p, p.to(torch.float32)))


@contextmanager
def _bounded(torch, modules, elements, why):
    """Modules built inside number at most modules, and a tensor made inside off the meta device holds at most
    elements; more is a ValueError (why: what the bounds come from).  A config.json of 2**40 layers fails at once
    rather than building them for days, and one of 2**40 positions before its position_ids are made: the kernel
    may grant the memory (overcommit) and the process be killed as it is written.  It swaps
    torch.nn.Module.__init__ while open, as empty_weights swaps register_parameter, and asks each of torch's
    factories (torch.empty, torch.arange, ...) for its tensor on the meta device first: its shape, no memory."""
    from torch.overrides import TorchFunctionMode
    try:
        from torch.utils._device import _device_constructors
        factories = _device_constructors()
    except ImportError:  # torch keeps the list private; the tensors made are still checked once made
        factories = set()
    init = torch.nn.Module.__init__
    made = [0]

    def counted(self, *args, **kwargs):
        made[0] += 1
        if made[0] > modules:
            raise ValueError(f"it describes a model of more than the {modules} modules {why}")
        init(self, *args, **kwargs)

    def refuse(func, shape):
        if math.prod(shape) > elements:
            raise ValueError(f"it describes a tensor of {math.prod(shape)} elements ({getattr(func, '__name__', func)}"
                             f" of shape {tuple(shape)}), more than the {elements} {why}")

    class Sized(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in factories and torch.device(kwargs.get("device") or "cpu").type != "meta":
                try:
                    shape = func(*args, **{**kwargs, "device": "meta"}).shape
                except (RuntimeError, TypeError, NotImplementedError):
                    shape = ()  # no meta kernel: checked once made
                refuse(func, shape)
            out = func(*args, **kwargs)
            if isinstance(out, torch.Tensor) and out.device.type != "meta":
                refuse(func, out.shape)
            return out

    torch.nn.Module.__init__ = counted
    try:
        with Sized():
            yield
    finally:
        torch.nn.Module.__init__ = init


def _hf_rules(model, version, path, doc):
    """The rules of the transformers from_pretrained sluice's mirrors (see _Rules): the names it does not count
    (its _keys_to_ignore_on_load_missing and _unexpected, an old checkpoint's rotary_emb.inv_freq; transformers 4
    also any name of a buffer of the model, transformers 5 position_ids), and transformers 4 keeping tied weights
    tied where transformers 5 unties those the checkpoint holds with different values."""
    def matches(patterns):
        patterns = list(patterns or ())
        return re.compile("|".join(f"({p})" for p in patterns)).search if patterns else None

    buffers = [n for n, _ in model.named_buffers()]
    unexpected = set(getattr(model, "_keys_to_ignore_on_load_unexpected", None) or ())
    if any(n.endswith("rotary_emb.inv_freq") for n in buffers):
        unexpected.add(r"rotary_emb\.inv_freq")
    if version >= (5, 0) and any(n.endswith("position_ids") for n in buffers):
        unexpected.add(r"(^|\.)position_ids$")
    ignored = matches(unexpected)
    skip_unexpected = ignored
    if version < (5, 0):
        prefix = (getattr(model, "base_model_prefix", "") or "") + "."
        named = set(buffers)

        def skip_unexpected(k):
            return bool((ignored and ignored(k)) or k in named or prefix + k in named
                        or (k.startswith(prefix) and k[len(prefix):] in named))
    archs = doc.get("architectures") or []
    return _Rules("sluice.from_pretrained", version >= (5, 0),
                  matches(getattr(model, "_keys_to_ignore_on_load_missing", None)), skip_unexpected,
                  f"; the model is the {type(model).__name__} {shown(path)} describes",
                  type(model).__name__ not in archs, _hf_conversion if version >= (5, 0) else None)


def _generation_config(transformers, version, model, source, doc):
    """model.generation_config as transformers' from_pretrained sets it: from source's generation_config.json
    where it holds one (read through sluice, then given to transformers' own GenerationConfig.from_pretrained);
    without one, transformers 5 makes it of config.json's generation settings, transformers 4 keeps the one the
    model made of its config."""
    if not (callable(getattr(model, "can_generate", None)) and model.can_generate()):
        return
    path = _join(source, "generation_config.json")
    try:
        gen = _json_object(path, "a generation_config.json")
    except SluiceError as e:
        if e.code != -errno.ENOENT:
            raise
        gen = None
    if gen is None and version < (5, 0):
        return
    with tempfile.TemporaryDirectory(prefix="sluice-gen-") as tmp:
        name = "generation_config.json" if gen is not None else "config.json"
        with open(os.path.join(tmp, name), "w") as f:
            json.dump(gen if gen is not None else doc, f)
        try:
            if gen is not None:
                got = transformers.GenerationConfig.from_pretrained(tmp, local_files_only=True)
            else:
                got = transformers.GenerationConfig.from_pretrained(tmp, config_file_name="config.json",
                                                                    _from_model_config=True, local_files_only=True)
        except Exception as e:
            raise bad(path if gen is not None else _join(source, "config.json"),
                      f"transformers {transformers.__version__}'s GenerationConfig refuses it ({_why(e)})") from e
    model.generation_config = got


def _device_map(transformers, model, device_map):
    """({name: device} of every tensor and buffer of the model, the map transformers would dispatch or None) of
    a device_map as transformers' from_pretrained takes it (a dict of module names, "auto", "balanced",
    "balanced_low_0", "sequential", a device), placed by transformers' own functions (accelerate's for "auto")."""
    try:
        from transformers.integrations.accelerate import (_get_device_map, check_and_set_device_map,
                                                          expand_device_map)
    except ImportError:
        raise ValueError(f"sluice.from_pretrained: device_map= needs transformers 5 (this is "
                         f"{transformers.__version__}): pass device= or load with transformers") from None
    try:
        dm = _get_device_map(model, check_and_set_device_map(device_map), None, None)
    except ImportError as e:
        raise ValueError(f"sluice.from_pretrained: device_map={device_map!r} needs accelerate ({e}): "
                         f"pip install accelerate") from None
    if not isinstance(dm, dict):
        raise ValueError(f"sluice.from_pretrained: device_map={device_map!r} is no device map")
    if any(d == "disk" for d in dm.values()):
        raise ValueError(f"sluice.from_pretrained: device_map={device_map!r} offloads to disk, which sluice does "
                         f"not: load with transformers")
    names = list(model.state_dict()) + [n for n, _ in model.named_buffers(remove_duplicate=False)]
    return expand_device_map(dm, names), (dm if len({str(d) for d in dm.values()}) > 1 else None)


def from_pretrained(source, model_class=None, device="cuda", dtype=None, strict=True, variant=None, report=None,
                    process_group=None, device_map=None, **kwargs):
    """A transformers model ready on device (for its first forward, in eval mode) from source: a directory, or
    an s3:// or http(s):// prefix ending in /, that holds config.json and the safetensors checkpoint (its index,
    else its files, as sluice.load finds them), and generation_config.json where the model generates.

    The same model transformers' from_pretrained makes of it (transformers 4.57 or later; an older one is refused):
    the same parameters, dtypes, ties and generation_config, so the same logits and the same generate().
    model_class: the transformers class to build (LlamaForCausalLM); None, the first of config.json's
    architectures.  dtype: of the floating parameters; "auto", config.json's dtype, else the checkpoint's; None,
    what transformers' from_pretrained takes without dtype= ("auto" in transformers 5, torch's default dtype,
    float32, in transformers 4); the modules transformers keeps in float32 stay float32.  kwargs go to the config, as
    transformers' from_pretrained passes them (attn_implementation=).
    strict: which tensors count as missing or unexpected is transformers' rule (its _keys_to_ignore_on_load_*
    lists, and the buffers it passes over); True (the default) refuses them, a ValueError naming each before
    anything is read, where transformers logs a warning and goes on (random weights for the missing ones): a
    config.json of other sizes than its checkpoint's is a mistake sluice does not load; False loads what both
    hold, the missing ones zeros, and logs transformers' warning (logger "sluice").
    A config.json value transformers or the model refuses, or of a type its default rules out, is an error
    naming config.json and the key.
    The model is built with its parameters on the meta device and its buffers made as usual, then load_model
    reads the checkpoint into place (see it for variant, report and process_group).  Checkpoints whose names
    transformers 5 renames or converts as it loads them are loaded by transformers' own rules for the model (its
    conversion mapping): renamed tensors (GPT-NeoX's embed_out as lm_head, old checkpoints' gamma and beta) are
    read into place; converted ones (the per-expert weights of Mixtral, Qwen2-MoE, Qwen3-MoE and the models that
    share their layout, stacked into fused experts) are made by transformers' own operations from what sluice
    reads, a few GB of sources at a time.
    device_map: as transformers' from_pretrained takes it (a dict of module names to devices, "auto" and the
    other names accelerate fills, transformers 5 and accelerate needed for those): each tensor goes where
    transformers' own functions place it, the tensors of each device read as one batched read onto it, the
    devices' reads at once; over several devices the model gets accelerate's hooks, as transformers gives it.
    Offloading to disk is refused.  Not handled: remote code and quantized checkpoints: load those with
    transformers."""
    import torch
    transformers, version = _transformers()
    source = os.fspath(source)
    if model_class is not None and not (isinstance(model_class, type) and issubclass(model_class, torch.nn.Module)):
        raise TypeError(f"sluice.from_pretrained: model_class={model_class!r} is not a torch.nn.Module class")
    config, config_class, path, doc = _config(source, model_class, kwargs, transformers)
    if model_class is None:
        arch = (getattr(config, "architectures", None) or [None])[0]
        found = getattr(transformers, arch, None) if isinstance(arch, str) else None
        if not (isinstance(found, type) and issubclass(found, transformers.PreTrainedModel)):
            raise ValueError(f"sluice.from_pretrained: {_named(source)}: config.json names no model class "
                             f"transformers has ({arch!r}): pass model_class=")
        model_class = found
    # The checkpoint open from its listing to its load: its headers read once, its files through one open each.
    with _Open(_sources(source, variant)) as ckp:
        table = ckp.listing()
        if dtype is None and version < (5, 0):
            dtype = torch.get_default_dtype()  # transformers 4's from_pretrained without dtype= (5's is "auto")
        if dtype in (None, "auto"):
            dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
            if dtype is not None:
                try:
                    dtype = _torch_dtype(torch, dtype)
                except ValueError:
                    raise bad(path, f"{'dtype' if 'dtype' in doc else 'torch_dtype'}={_short(dtype)} is not a model's "
                                    f"floating dtype (one of {', '.join(_MODEL_DTYPES)})") from None
            else:
                dtype = next((DT[dt][1] for dt, _ in table.values()
                              if DT[dt][1] in _MODEL_DTYPES), "float32")
        dtype = _torch_dtype(torch, dtype)
        try:  # transformers' switch for its weights' initialisation: no use on weights the checkpoint replaces
            from transformers.initialization import no_init_weights
        except ImportError:
            no_init_weights = nullcontext

        # A model has about as many modules as tensors (a layer's norm, its linears), and no tensor larger than the
        # whole checkpoint but the buffers it computes (GPT-2's causal mask in transformers 4: 1024 x 1024)
        modules = 16 * len(table) + 1024
        elements = sum(math.prod(shape) for _, shape in table.values()) + (1 << 26)
        why = f"its checkpoint of {len(table)} tensors can fill"

        def build(d):
            with empty_weights(), no_init_weights(), _bounded(torch, modules, elements, why):
                c = config if d is doc else config_class.from_dict(d, **kwargs)
                make = getattr(model_class, "_from_config", None)
                return make(c, dtype=dtype) if make else model_class(c)

        model = _from_doc(path, doc, build, f"transformers {transformers.__version__}'s {model_class.__name__}")
        _keep_fp32(torch, model, dtype)
        placed, dispatch = _device_map(transformers, model, device_map) if device_map is not None else (None, None)
        _load(model, source, device, None, strict, variant, report, process_group,
              _hf_rules(model, version, path, doc), ckp, placed)
    if dispatch is not None:  # several devices: accelerate's hooks move each module's inputs, as transformers does
        from transformers.integrations.accelerate import accelerate_dispatch
        accelerate_dispatch(model, None, dispatch, None, None, False)
    _generation_config(transformers, version, model, source, doc)
    return model.eval()
