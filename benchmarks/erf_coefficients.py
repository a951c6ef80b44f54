"""Derive the erf approximation of kernels/templates/gelu_erf.S (ipu-stack's own fit).

erf(u) = u * P(u^2) for |z| < T, P of degree 6 (relative error weighted);
erf(v) = 1 - exp(-v^2) * Q((v - M) / H) for T <= v <= 4, Q of degree 9 weighted by exp(-v^2)
(the absolute error of erf, which the semantics round to f32 at magnitude ~1).
Both fits are least squares iterated to near-minimax (Lawson weights) on Chebyshev nodes, in
float64 from scipy's erf/erfcx, then rounded to f32. Prints the f32 bit patterns and the fit's
error; ``--check`` also evaluates the f32 device order against scipy's correctly rounded erf.

Run: python3 benchmarks/erf_coefficients.py [--check]
"""

from __future__ import annotations

import sys

import numpy as np
from scipy.special import erf, erfcx

T = 0.875
TOP = 4.0
M, H = (TOP + T) / 2, (TOP - T) / 2


def _lawson(v: np.ndarray, f: np.ndarray, w: np.ndarray, iters: int = 100) -> np.ndarray:
    wt = np.ones(len(f))
    c = np.zeros(v.shape[1])
    for _ in range(iters):
        sw = w * np.sqrt(wt)
        c, *_ = np.linalg.lstsq(v * sw[:, None], f * sw, rcond=None)
        e = np.abs(v @ c - f) * w
        wt = wt * (e + 1e-300)
        wt /= wt.sum()
    return c


def fit() -> tuple[np.ndarray, np.ndarray]:
    nodes = np.cos(np.linspace(0, np.pi, 6001)) * 0.5 + 0.5
    s = nodes * T * T
    s = s[s > 0]
    f = erf(np.sqrt(s)) / np.sqrt(s)
    p = _lawson(np.vander(s, 7, increasing=True), f, 1 / f)
    v = nodes * (TOP - T) + T
    q = _lawson(np.vander((v - M) / H, 10, increasing=True), erfcx(v), np.exp(-v * v))
    return p.astype(np.float32), q.astype(np.float32)


def device_erf(z: np.ndarray, p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The template's f32 order of operations (gelu_erf.S ERF_PAIR)."""
    f32 = np.float32
    a = np.abs(z.astype(f32))
    u = np.minimum(a, f32(T))
    s = u * u
    acc = p[6]
    for k in range(5, -1, -1):
        acc = acc * s + p[k]
    central = u * acc
    v = np.maximum(np.minimum(a, f32(TOP)), f32(T))
    t = (v - f32(M)) * f32(1 / H)
    acc = q[9] * np.ones_like(t)
    for k in range(8, -1, -1):
        acc = acc * t + q[k]
    e = np.exp((f32(0) - v * v).astype(np.float64)).astype(f32)
    tail = f32(1) - e * acc
    r = np.where(a < f32(T), central, tail)
    return np.copysign(r, z).astype(f32)


def main() -> None:
    p, q = fit()
    for name, c in (("P", p), ("Q", q)):
        for k, x in enumerate(c):
            print(f"{name}{k} 0x{np.float32(x).view(np.uint32):08X}  // {float(x):.9g}")
    print(f"M 0x{np.float32(M).view(np.uint32):08X} 1/H 0x{np.float32(1 / H).view(np.uint32):08X}")
    if "--check" in sys.argv:
        z = np.random.default_rng(0).uniform(-4.5, 4.5, 2_000_000).astype(np.float32)
        want = erf(z.astype(np.float64)).astype(np.float32)
        got = device_erf(z, p, q)
        ulp = np.spacing(np.abs(want)).astype(np.float64)
        err = np.abs(got.astype(np.float64) - want) / ulp
        print("max ulp", err.max(), "mean", err.mean(), "share exact", (err == 0).mean())
        big = np.abs(z) >= T
        print("tail max ulp", err[big].max(), "central max ulp", err[~big].max())


if __name__ == "__main__":
    main()
