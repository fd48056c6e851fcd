"""Weights an engine rewrites after loading: dcr.Receiver(post_load=dcr.PostLoad(...)).

A serving engine may not leave the loader's bits in the parameters: vLLM runs a post-load step
(`process_weights_after_loading`) per layer that converts, prepacks or empties them. A receiver
that recorded the loader's copies and XORed deltas into such storage would write wrong bits
silently. The engine integration therefore declares its post-load units: per module, the
loader-layout tensors (names, dtypes, shapes, the parameters' attributes such as a
weight_loader) and the step itself. At prewarm dcr probes every unit:

1. It materializes the loader layout (staging tensors), fills them with coded values (each
   element's index, in finite bit patterns of its dtype, over as many runs as the index needs),
   runs the step on a copy, and decodes every tensor the module holds afterwards. The module
   (and its quant method) is put back as it was after each probe run.
2. A unit whose visible runtime tensors hold every loader element exactly once or more, bit for
   bit (verified with a further run of random finite values), and which keeps no state dcr
   cannot see (a new callable, kernel object or handle in the module or its quant method), is a
   *permutation*: the loader's recorded copies into the staging tensors are composed with it and
   compiled into strided copies into the live runtime tensors. No extra memory; XOR records stay
   exact. The identity is the trivial case.
3. Any other unit (opaque prepacking, a value transform, hidden state) is *re-run*: dcr keeps the
   loader-layout staging tensors for it (their bytes are reported), records the loader into
   them, and after every transition, dense load or restore re-runs the engine's own step for
   the units whose staging changed (a BLAKE2b digest per unit), from a copy of the staging
   tensors. A unit declared rerun=False (or whose step fails) is refused at prewarm with
   dcr.UnsupportedLoaderPath naming each canonical tensor and why.
"""

from __future__ import annotations

import hashlib
import math

from . import _dcr

# Finite, positive bit patterns per float dtype: (bits, exponent shift, exponent count).
_CODES = {"torch.bfloat16": (16, 7, 254), "torch.float16": (16, 10, 30), "torch.float32": (32, 23, 254)}
_SCALAR = (bool, int, float, str, bytes, type(None))


class PostLoadUnit:
    """One module the engine post-processes after loading.

    name: the module's path (for messages). module: the torch module. layout: {tensor name:
    tensor} in the loader's layout (meta tensors are fine; their class and attributes, such as a
    weight_loader, are kept). step(module): the engine's own post-load step for this module.
    rerun: whether dcr may re-run the step after a refit (False: such a unit is refused)."""

    def __init__(self, name, module, layout, step, rerun=True, what=None, transparent=()):
        self.name = name
        # Attributes the step sets that the integration declares hold no weight data (a kernel
        # object that reads the layer's parameters at every call): not hidden state.
        self.transparent = set(transparent)
        self.module = module
        self.layout = dict(layout)
        self.step = step
        self.rerun = rerun
        self.what = what or getattr(step, "__qualname__", "the post-load step")
        self.kind = None        # "permutation" | "rerun" | "refused"
        self.reason = ""
        self.map = None         # permutation: {staging name: (runtime keys, offsets) per element}
        self.staging = {}       # name -> staging tensor (loader layout)
        self.digest = None


class PostLoad:
    """The engine's post-load step, as an integration declares it: the model and its units."""

    def __init__(self, model, units, refuse=(), forbidden=()):
        self.model = model
        self.units = list(units)
        self.refuse = list(refuse)   # (description, reason): engine steps dcr cannot handle at all
        # (module name, module, reason): modules whose post-load step dcr does not run; a loader
        # copy into one of their tensors is refused at prewarm.
        self.forbidden = list(forbidden)

    # ---- state of a module -------------------------------------------------------------------

    @staticmethod
    def _objects(module):
        qm = getattr(module, "quant_method", None)
        return [module] + ([qm] if qm is not None and hasattr(qm, "__dict__") else [])

    def _snapshot(self, module):
        snap = []
        for o in self._objects(module):
            d = dict(o.__dict__)
            extra = {}
            for k in ("_parameters", "_buffers", "_modules"):
                if isinstance(d.get(k), dict):
                    extra[k] = dict(d[k])
            if isinstance(d.get("_non_persistent_buffers_set"), set):
                extra["_non_persistent_buffers_set"] = set(d["_non_persistent_buffers_set"])
            snap.append((o, d, extra))
        return snap

    @staticmethod
    def _restore(snap):
        for o, d, extra in snap:
            o.__dict__.clear()
            o.__dict__.update(d)
            for k, v in extra.items():
                cur = o.__dict__[k]
                cur.clear()
                cur.update(v)

    @staticmethod
    def _hidden(before, module):
        """Attributes the step added or replaced that are neither tensors nor plain values."""
        import torch
        out = []
        for (o, d, _extra), o2 in zip(before, PostLoad._objects(module)):
            for k, v in o2.__dict__.items():
                if k in ("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set") or k.startswith("_forward"):
                    continue
                if k in d and d[k] is v:
                    continue
                if isinstance(v, _SCALAR) or isinstance(v, torch.Tensor):
                    continue
                if isinstance(v, (tuple, list)) and all(isinstance(x, _SCALAR) for x in v):
                    continue
                out.append(f"{type(o2).__name__}.{k}")
        return out

    @staticmethod
    def runtime_tensors(module):
        """Every tensor the module holds directly: parameters, buffers, tensor attributes."""
        import torch
        out = {}
        for k, v in module._parameters.items():
            if v is not None:
                out[k] = v
        for k, v in module._buffers.items():
            if v is not None:
                out[k] = v
        for k, v in module.__dict__.items():
            if isinstance(v, torch.Tensor) and k not in out:
                out[k] = v
        return out

    @staticmethod
    def _materialize(t):
        import torch
        x = torch.empty(tuple(t.shape), dtype=t.dtype)
        cls = t.__class__
        if issubclass(cls, torch.nn.Parameter):
            p = torch.nn.Parameter(x, requires_grad=False)
            if cls is not torch.nn.Parameter:
                p.__class__ = cls
            p.__dict__.update(t.__dict__)
            return p
        return x

    def _install(self, unit, tensors):
        import torch
        m = unit.module
        for k, v in tensors.items():
            if isinstance(v, torch.nn.Parameter):
                m._buffers.pop(k, None)
                m._parameters[k] = v
            else:
                m._parameters.pop(k, None)
                m._buffers[k] = v
            m.__dict__.pop(k, None)

    # ---- probing -----------------------------------------------------------------------------

    def _fill(self, unit, tensors, run, runs, rand=None, flip=False):
        import torch
        base = 0
        for k, t in tensors.items():
            n = t.numel()
            if rand is not None:
                words = _finite_random(t.dtype, n, rand)
            else:
                bits, shift, count = _CODES[str(t.dtype)]
                mant = 1 << shift
                digit = (torch.arange(base, base + n, dtype=torch.int64) // (count * mant) ** run) % (count * mant)
                words = ((digit // mant + 1) << shift) | (digit % mant)
                if flip:   # every element differs from the plain fill, and stays finite
                    words = words ^ 1
            view = t.data.view(-1).view(torch.int16 if _CODES[str(t.dtype)][0] == 16 else torch.int32)
            view.copy_(words.to(view.dtype) if rand is None else words)
            base += n

    def _run_step(self, unit, tensors):
        """Runs the unit's step on copies of `tensors` from the engine's current state; returns
        ({runtime key: tensor}, hidden attributes). The module is put back afterwards."""
        snap = self._snapshot(unit.module)
        try:
            copies = {}
            for k, t in tensors.items():
                c = self._materialize(t)
                c.data.copy_(t.data)
                copies[k] = c
            self._install(unit, copies)
            unit.step(unit.module)
            hidden = [h for h in self._hidden(snap, unit.module) if h.split(".", 1)[1] not in unit.transparent]
            rt = {k: v.detach().clone() for k, v in self.runtime_tensors(unit.module).items()}
            shapes = {k: (tuple(v.shape), v.dtype) for k, v in self.runtime_tensors(unit.module).items()}
            return rt, shapes, hidden
        finally:
            self._restore(snap)

    def probe(self, unit):
        import torch
        staging = {k: self._materialize(t) for k, t in unit.layout.items()}
        unit.staging = staging
        bad = [k for k, t in staging.items() if str(t.dtype) not in _CODES]
        total = sum(t.numel() for t in staging.values())
        try:
            if bad:
                raise _Opaque(f"loader-layout tensor '{bad[0]}' is {staging[bad[0]].dtype}, which dcr does not probe")
            base = min(_CODES[str(t.dtype)][2] << _CODES[str(t.dtype)][1] for t in staging.values()) if staging else 2
            runs = max(1, math.ceil(math.log(max(total, 2)) / math.log(base)))
            decoded = None
            results = []
            for run in range(runs):
                self._fill(unit, staging, run, runs)
                results.append(self._run_step(unit, staging))
            again = self._run_step(unit, staging)  # determinism: the last fill once more
            if any(not torch.equal(_words(again[0][k]), _words(results[-1][0][k])) for k in again[0]) or \
                    again[0].keys() != results[-1][0].keys():
                raise _Opaque("the step's visible output differs between two runs on the same weights")
            hidden = results[0][2]
            if hidden:
                raise _Opaque(f"{unit.what} keeps state dcr cannot see ({', '.join(sorted(set(hidden)))})")
            self._fill(unit, staging, 0, runs, flip=True)
            flipped = self._run_step(unit, staging)[0]
            rand = torch.Generator().manual_seed(12345)
            self._fill(unit, staging, 0, 1, rand)
            rt, _, _ = self._run_step(unit, staging)
            decoded = self._decode(unit, staging, results, flipped)
            self._verify(unit, staging, decoded, rt, results[0][0])
            unit.kind, unit.map = "permutation", decoded
            unit.reason = "a permutation of the loader's elements, compiled into placement"
            unit.staging = staging  # used for the composition only; dropped after prewarm
        except _Opaque as e:
            unit.kind = "rerun" if unit.rerun else "refused"
            unit.reason = str(e)
        except Exception as e:  # the engine's step raised on probe weights
            unit.kind = "refused"
            unit.reason = f"{unit.what} failed on probe weights ({type(e).__name__}: {e})"
        return unit

    def _decode(self, unit, staging, results, flipped):
        """{runtime key: int64 tensor, per logical element, of the global staging index it
        holds, or -1 for an element the step makes without the weights (a constant: the same
        under two fills that differ in every element)}."""
        import torch
        sizes = [t.numel() for t in staging.values()]
        total = sum(sizes)
        covered = torch.zeros(total, dtype=torch.bool)
        out = {}
        dtypes = {str(t.dtype) for t in staging.values()}
        for key in results[0][0]:
            vals = [r[0][key] for r in results]
            f = flipped.get(key)
            if vals[0].numel() == 0:
                continue
            if f is None or f.shape != vals[0].shape or f.dtype != vals[0].dtype:
                raise _Opaque(f"runtime tensor '{key}' changes shape with the weights' values")
            const = (_words(f) == _words(vals[0])).reshape(-1)
            if bool(const.all()):
                continue  # made without the weights
            if str(vals[0].dtype) not in dtypes:
                raise _Opaque(f"runtime tensor '{key}' is {vals[0].dtype}: a value transform of the loader's elements")
            idx = torch.zeros(vals[0].numel(), dtype=torch.int64)
            bits, shift, count = _CODES[str(vals[0].dtype)]
            radix = count << shift
            for run, v in enumerate(vals):
                w = _words(v).reshape(-1).to(torch.int64) & ((1 << bits) - 1)
                exp = w >> shift
                bad = ((exp < 1) | (exp > count) | (w >> (bits - 1)).bool()) & ~const
                if bool(bad.any()):
                    raise _Opaque(f"runtime tensor '{key}' holds values that are not the loader's elements "
                                  "(a value transform)")
                digit = (exp - 1) * (1 << shift) + (w & ((1 << shift) - 1))
                idx += digit * radix ** run
            idx = torch.where(const, torch.full_like(idx, -1), idx)
            if bool((idx >= total).any()):
                raise _Opaque(f"runtime tensor '{key}' holds values that are not the loader's elements")
            covered[idx[idx >= 0]] = True
            out[key] = idx
        if not bool(covered.all()):
            missing = int((~covered).sum())
            names = list(staging)
            first = int((~covered).nonzero()[0])
            t, base = 0, 0
            while first >= base + sizes[t]:
                base += sizes[t]
                t += 1
            raise _Opaque(f"{missing} loader elements (first in '{names[t]}') are in no tensor the module holds "
                          "after the step (emptied or prepacked into storage dcr cannot see)")
        return out

    def _verify(self, unit, staging, decoded, rt, plain):
        """On random finite weights: every placed element is its source's bits, and every
        constant element is unchanged."""
        import torch
        flat = torch.cat([_words(t.data).reshape(-1).to(torch.int64) & 0xFFFFFFFF for t in staging.values()])
        for key, idx in decoded.items():
            got = _words(rt[key]).reshape(-1).to(torch.int64) & 0xFFFFFFFF
            const = idx < 0
            want = torch.where(const, _words(plain[key]).reshape(-1).to(torch.int64) & 0xFFFFFFFF,
                               flat[idx.clamp(min=0)])
            if not torch.equal(got, want):
                raise _Opaque(f"runtime tensor '{key}' is not a bit-exact rearrangement of the loader's elements")

    # ---- rerun -------------------------------------------------------------------------------

    def rerun_units(self):
        return [u for u in self.units if u.kind == "rerun"]

    def extra_bytes(self):
        seen, total = set(), 0
        for u in self.rerun_units():
            for t in u.staging.values():
                if t.data_ptr() not in seen:
                    seen.add(t.data_ptr())
                    total += t.numel() * t.element_size()
        return total

    @staticmethod
    def _digest(unit):
        h = hashlib.blake2b(digest_size=32)
        for t in unit.staging.values():
            h.update(_words(t.data).reshape(-1).numpy().tobytes() if t.numel() else b"")
        return h.digest()

    def sync(self, force=False):
        """Re-runs the engine's step for every re-run unit whose staging changed since its last
        run (all of them with force). Returns the names of the units re-run."""
        import torch
        done = []
        shared = {}
        with torch.no_grad():
            for u in self.rerun_units():
                d = self._digest(u)
                if not force and d == u.digest:
                    continue
                copies = {}
                for k, t in u.staging.items():
                    c = shared.get(t.data_ptr())
                    if c is None:
                        c = self._materialize(t)
                        c.data.copy_(t.data)
                        shared[t.data_ptr()] = c
                    copies[k] = c
                self._install(u, copies)
                u.step(u.module)
                u.digest = d
                done.append(u.name)
        return done


class _Opaque(Exception):
    pass


def _words(t):
    import torch
    t = t.detach()
    size = t.element_size()
    if t.dtype in (torch.int16, torch.int32, torch.int64, torch.uint8, torch.int8):
        return t
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size])


def _finite_random(dtype, n, gen):
    import torch
    bits, shift, count = _CODES[str(dtype)]
    exp = torch.randint(1, count + 1, (n,), generator=gen, dtype=torch.int64)
    mant = torch.randint(0, 1 << shift, (n,), generator=gen, dtype=torch.int64)
    sign = torch.randint(0, 2, (n,), generator=gen, dtype=torch.int64)
    w = (sign << (bits - 1)) | (exp << shift) | mant
    if bits == 16:
        w = torch.where(w >= 1 << 15, w - (1 << 16), w)
        return w.to(torch.int16)
    w = torch.where(w >= 1 << 31, w - (1 << 32), w)
    return w.to(torch.int32)


# ---- composing recorded copies with a permutation ------------------------------------------------

def _grid(extents, strides):
    import torch
    off = torch.zeros(1, dtype=torch.int64)
    for e, s in zip(extents, strides):
        off = (off.unsqueeze(-1) + torch.arange(e, dtype=torch.int64) * s).reshape(-1)
    return off


def _factorize(r, q):
    """Strided copies (r0, q0, extents, r strides, q strides) covering pairs r[i] <- q[i]
    (r sorted ascending, distinct)."""
    import torch
    n = r.numel()
    if n == 0:
        return []
    r, q = r.tolist(), q.tolist()
    runs = []   # (r0, q0, len, dr, dq)
    i = 0
    while i < n:
        if i + 1 < n:
            dr, dq = r[i + 1] - r[i], q[i + 1] - q[i]
            j = i + 1
            while j + 1 < n and r[j + 1] - r[j] == dr and q[j + 1] - q[j] == dq:
                j += 1
            runs.append((r[i], q[i], j - i + 1, dr, dq))
            i = j + 1
        else:
            runs.append((r[i], q[i], 1, 1, 1))
            i += 1
    out = []
    k = 0
    while k < len(runs):
        r0, q0, ln, dr, dq = runs[k]
        m = 1
        if k + 1 < len(runs) and runs[k + 1][2:] == (ln, dr, dq):
            sr, sq = runs[k + 1][0] - r0, runs[k + 1][1] - q0
            while k + m < len(runs) and runs[k + m][2:] == (ln, dr, dq) and \
                    runs[k + m][0] - runs[k + m - 1][0] == sr and runs[k + m][1] - runs[k + m - 1][1] == sq:
                m += 1
            out.append((r0, q0, (m, ln), (sr, dr), (sq, dq)))
        else:
            out.append((r0, q0, (ln,), (dr,), (dq,)))
        k += m
    return out


def compose(post: PostLoad, copies, live_units):
    """Replaces recorded copies into permutation units' staging by copies into their live
    runtime tensors; copies into re-run units' staging stay. Returns the new copy list."""
    import torch
    spans = []   # (start, end, unit, name, global base, itemsize)
    for u in post.units:
        if u.kind != "permutation":
            continue
        base = 0
        for k, t in u.staging.items():
            spans.append((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size(), u, k, base, t.element_size()))
            base += t.numel()
    out, composed = [], {}
    for c in copies:
        name, dst, dst_dtype, extents, dst_strides, src_offset, src_strides = c
        hit = next((s for s in spans if s[0] <= dst < s[1]), None)
        if hit is None:
            out.append(c)
            continue
        start, _, u, k, base, isz = hit
        g = base + (dst - start) // isz + _grid(extents, dst_strides)
        q = src_offset + _grid(extents, src_strides)
        for key, idx in u.map.items():
            live = live_units[u.name][key]
            inv = torch.full((sum(t.numel() for t in u.staging.values()),), -1, dtype=torch.int64)
            # every runtime element j holds staging element idx[j]; several j may hold one
            sel = torch.isin(idx, g) & (idx >= 0)
            if not bool(sel.any()):
                continue
            inv[g] = q
            j = sel.nonzero().reshape(-1)
            # runtime logical index j -> storage offset in the live tensor
            roff = _grid(tuple(live.shape), tuple(live.stride()))[j]
            order = torch.argsort(roff)
            composed.setdefault((name, key, u.name, dst_dtype), []).append((roff[order], inv[idx[j]][order]))
    for (name, key, uname, dst_dtype), parts in composed.items():
        live = live_units[uname][key]
        r = torch.cat([p[0] for p in parts])
        q = torch.cat([p[1] for p in parts])
        order = torch.argsort(r)
        r, q = r[order], q[order]
        isz = live.element_size()
        for r0, q0, ext, rs, qs in _factorize(r, q):
            out.append((name, live.data_ptr() + r0 * isz, dst_dtype, tuple(ext), tuple(rs), q0, tuple(qs)))
    return out


# ---- prewarm -------------------------------------------------------------------------------------

def record_through(post: PostLoad, record):
    """Probes every unit, then records the loader (twice, via `record(fill)`) with the loader
    layout installed in every unit, and puts the engine back. Returns the two recordings."""
    import torch
    if post.refuse:
        raise _dcr.UnsupportedLoaderPath(
            "dcr post-load: " + "; ".join(f"{what}: {why}" for what, why in post.refuse))
    with torch.no_grad():
        for u in post.units:
            post.probe(u)
        snaps = [post._snapshot(u.module) for u in post.units]
        try:
            shared = {}
            for u in post.units:
                live = post.runtime_tensors(u.module)
                for k in list(u.staging):
                    v = live.get(k)
                    if v is not None and id(v) in shared and shared[id(v)].shape == u.staging[k].shape:
                        u.staging[k] = shared[id(v)]   # a tied parameter: one staging tensor
                    elif v is not None:
                        shared[id(v)] = u.staging[k]
                post._install(u, u.staging)
            first, second = record(0), record(1)
        finally:
            for s in snaps:
                PostLoad._restore(s)
    return first, second


def finish(post: PostLoad, rec):
    """Refuses what cannot be compiled or re-run (naming each canonical tensor and why), composes
    permutations, checks every copy writes storage the model holds, and sets the re-run units up
    (their staging tensors kept, the step re-run from them on the next sync)."""
    def tensors_into(u):
        spans = [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in u.staging.values()]
        return sorted({c[0] for c in rec.copies if any(a <= c[1] < b for a, b in spans)})

    refused = [u for u in post.units if u.kind == "refused"]
    if refused:
        lines = []
        for u in refused:
            names = tensors_into(u) or [f"{u.name}.{k}" for k in u.layout]
            why = u.reason if u.rerun or "failed" in u.reason else u.reason + "; re-running the step is not allowed"
            lines.extend(f"'{n}' ({u.name}: {why})" for n in names)
        raise _dcr.UnsupportedLoaderPath("dcr post-load: the engine rewrites these tensors after loading in a "
                                         "way dcr can neither compile nor re-run: " + "; ".join(lines))
    live = {u.name: post.runtime_tensors(u.module) for u in post.units if u.kind == "permutation"}
    copies = compose(post, rec.copies, live)
    for u in post.units:
        if u.kind == "permutation":
            u.staging = {}   # used for the composition only
    # Every copy must write storage the model holds now (or a re-run unit's staging).
    spans = []
    for t in list(post.model.parameters()) + list(post.model.buffers()):
        if t.numel():
            spans.append((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()))
    for u in post.rerun_units():
        for t in u.staging.values():
            spans.append((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()))
    for c in copies:
        if not any(a <= c[1] < b for a, b in spans):
            raise _dcr.UnsupportedLoaderPath(
                f"dcr post-load: a copy of tensor '{c[0]}' writes storage the model no longer holds "
                "(the engine replaced it after loading and no post-load unit declares it)")
    for mname, module, why in post.forbidden:
        for k, t in PostLoad.runtime_tensors(module).items():
            a, b = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
            for c in copies:
                if t.numel() and a <= c[1] < b:
                    raise _dcr.UnsupportedLoaderPath(
                        f"dcr post-load: tensor '{c[0]}' is loaded into {mname}.{k}, which {why}")
    for u in post.rerun_units():
        rec.keep.extend(u.staging.values())
        u.digest = None
    return copies
