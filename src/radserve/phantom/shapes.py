"""Implicit shapes and the canvases they are painted on.

Every shape answers ``contains(x, y, z)`` for broadcastable body-frame coordinate
arrays. On a voxel grid the arrays are (1,1,C), (1,R,1), (S,1,1): shapes compute their
in-plane terms on the small (1,R,C) grid first and only then combine with z, so each
shape costs a handful of full-size operations, and only inside its bounding box. The
same code run on a point canvas (N,) tells which organ lies at arbitrary points, which
is how lesions are checked to lie inside their organ before any voxel exists.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

Array = np.ndarray
PixelFilter = Callable[[Array, Array], Array]


class Shape(Protocol):
    """Anything paintable: a conservative bounding box and a membership test."""

    def bbox(self) -> tuple[Array, Array]: ...

    def contains(self, x: Array, y: Array, z: Array) -> Array: ...


@dataclass(frozen=True)
class Region:
    """Part of a canvas: where to write, and the body-frame coordinates there."""

    idx: tuple
    x: Array
    y: Array
    z: Array
    shape: tuple[int, ...]
    fancy: bool


class Canvas:
    """Tissue and organ codes (plus lesion ids) at a set of body-frame positions."""

    tissue: Array
    organ: Array
    lesion: Array

    def region(
        self, lo: Array, hi: Array, pixel_filter: PixelFilter | None = None
    ) -> Region | None:
        raise NotImplementedError

    def z_range(self) -> tuple[float, float]:
        """Body-frame z span of the canvas (to skip shapes quickly)."""
        raise NotImplementedError

    def get(self, array: Array, region: Region) -> Array:
        return np.broadcast_to(array[region.idx], region.shape)

    def paint(self, region: Region, mask: Array, **values: int) -> None:
        """Write ``values`` (tissue=, organ=, lesion=) where ``mask`` is true."""
        mask = np.broadcast_to(mask, region.shape)
        for name, value in values.items():
            array = getattr(self, name)
            if region.fancy:
                sub = array[region.idx]
                sub[mask] = value
                array[region.idx] = sub
            else:
                array[region.idx][mask] = value


class GridCanvas(Canvas):
    """A block of slices of the voxel grid, given by its body-frame axes."""

    def __init__(self, qz: Array, qy: Array, qx: Array) -> None:
        self.qz, self.qy, self.qx = qz, qy, qx
        shape = (qz.size, qy.size, qx.size)
        self.tissue = np.zeros(shape, np.uint8)
        self.organ = np.zeros(shape, np.uint8)
        self.lesion = np.zeros(shape, np.uint16)

    def z_range(self) -> tuple[float, float]:
        return float(self.qz[0]), float(self.qz[-1])

    def region(
        self, lo: Array, hi: Array, pixel_filter: PixelFilter | None = None
    ) -> Region | None:
        c0, c1 = np.searchsorted(self.qx, lo[0], "left"), np.searchsorted(self.qx, hi[0], "right")
        r0, r1 = np.searchsorted(self.qy, lo[1], "left"), np.searchsorted(self.qy, hi[1], "right")
        s0, s1 = np.searchsorted(self.qz, lo[2], "left"), np.searchsorted(self.qz, hi[2], "right")
        if c1 <= c0 or r1 <= r0 or s1 <= s0:
            return None
        z = self.qz[s0:s1]
        if pixel_filter is None:
            return Region(
                (slice(s0, s1), slice(r0, r1), slice(c0, c1)),
                self.qx[None, None, c0:c1],
                self.qy[None, r0:r1, None],
                z[:, None, None],
                (s1 - s0, r1 - r0, c1 - c0),
                False,
            )
        keep = pixel_filter(self.qx[None, c0:c1], self.qy[r0:r1, None])
        rr, cc = np.nonzero(np.broadcast_to(keep, (r1 - r0, c1 - c0)))
        if rr.size == 0:
            return None
        rr, cc = rr + r0, cc + c0
        return Region(
            (slice(s0, s1), rr, cc),
            self.qx[cc][None, :],
            self.qy[rr][None, :],
            z[:, None],
            (s1 - s0, rr.size),
            True,
        )


class PointCanvas(Canvas):
    """Arbitrary body-frame points; used to query the anatomy without a grid."""

    def __init__(self, points: Array) -> None:
        pts = np.asarray(points, np.float32).reshape(-1, 3)
        self.x, self.y, self.z = pts[:, 0].copy(), pts[:, 1].copy(), pts[:, 2].copy()
        self.tissue = np.zeros(len(pts), np.uint8)
        self.organ = np.zeros(len(pts), np.uint8)
        self.lesion = np.zeros(len(pts), np.uint16)

    def z_range(self) -> tuple[float, float]:
        return float(self.z.min(initial=np.inf)), float(self.z.max(initial=-np.inf))

    def region(
        self, lo: Array, hi: Array, pixel_filter: PixelFilter | None = None
    ) -> Region | None:
        # Same inclusive bounding-box rule as the grid, so both canvases agree exactly.
        inside = (
            (self.x >= lo[0])
            & (self.x <= hi[0])
            & (self.y >= lo[1])
            & (self.y <= hi[1])
            & (self.z >= lo[2])
            & (self.z <= hi[2])
        )
        if pixel_filter is not None:
            inside &= np.broadcast_to(pixel_filter(self.x, self.y), inside.shape)
        (idx,) = np.nonzero(inside)
        if idx.size == 0:
            return None
        return Region((idx,), self.x[idx], self.y[idx], self.z[idx], (idx.size,), True)


def _f32(value: float) -> np.float32:
    return np.float32(value)


@dataclass(frozen=True)
class Blob:
    """A superellipsoid with a smooth random deformation: one organ's shape.

    ``level = |u|^p + |v|^p + |w|^q + deformation < 1`` with (u, v) the in-plane
    offsets rotated by ``theta`` and divided by the semi-axes, w the z offset over
    ``semi[2]``. ``taper`` thins the v extent towards +u (the liver's left lobe),
    ``z_taper`` shortens the z extent towards +u. The deformation is a sum of a few
    low-frequency sines (amplitudes ``amps``) so no two seeds give the same organ.
    """

    centre: tuple[float, float, float]
    semi: tuple[float, float, float]
    p: float = 2.0
    q: float = 2.0
    theta: float = 0.0
    taper: float = 0.0
    z_taper: float = 0.0
    amps: tuple[float, ...] = (0.0,) * 5
    freqs: tuple[float, ...] = (1.0,) * 8
    phases: tuple[float, ...] = (0.0,) * 6

    @classmethod
    def random(
        cls,
        rng: np.random.Generator,
        centre: tuple[float, float, float],
        semi: tuple[float, float, float],
        *,
        shift_mm: float = 8.0,
        scale_jitter: float = 0.12,
        theta: float = 0.0,
        theta_jitter: float = 0.12,
        deform: float = 0.1,
        **kwargs: float,
    ) -> Blob:
        """Perturb a nominal shape: shift, per-axis scale, rotation and deformation."""
        overall = rng.uniform(1 - scale_jitter, 1 + scale_jitter)
        axes = np.asarray(semi) * overall * rng.uniform(0.94, 1.06, 3)
        c = np.asarray(centre) + rng.uniform(-shift_mm, shift_mm, 3)
        amps = deform * rng.uniform(0.3, 1.0, 5) * rng.choice([-1.0, 1.0], 5)
        return cls(
            centre=tuple(float(v) for v in c),
            semi=tuple(float(v) for v in axes),
            theta=float(theta + rng.uniform(-theta_jitter, theta_jitter)),
            amps=tuple(float(v) for v in amps),
            freqs=tuple(float(v) for v in rng.uniform(1.0, 3.0, 8)),
            phases=tuple(float(v) for v in rng.uniform(0, 2 * np.pi, 6)),
            **kwargs,
        )

    def shrunk(self, mm: float) -> Blob:
        """Same shape with every semi-axis reduced by ``mm`` (a wall's inner surface)."""
        semi = (
            max(1.0, self.semi[0] - mm),
            max(1.0, self.semi[1] - mm),
            max(1.0, self.semi[2] - mm),
        )
        return replace(self, semi=semi)

    def bbox(self) -> tuple[Array, Array]:
        d = sum(abs(a) for a in self.amps)
        eu = (1 + d) ** (1 / self.p)
        ev = eu * (1 + abs(self.taper))
        ew = ((1 + d) / max(1e-3, 1 - abs(self.z_taper))) ** (1 / self.q)
        a, b, c = self.semi
        cos, sin = abs(np.cos(self.theta)), abs(np.sin(self.theta))
        half = np.array([cos * a * eu + sin * b * ev, sin * a * eu + cos * b * ev, c * ew])
        centre = np.asarray(self.centre)
        return centre - half, centre + half

    def contains(self, x: Array, y: Array, z: Array) -> Array:
        cx, cy, cz = self.centre
        a, b, c = self.semi
        cos, sin = _f32(np.cos(self.theta)), _f32(np.sin(self.theta))
        dx, dy = x - _f32(cx), y - _f32(cy)
        u = (cos * dx + sin * dy) / _f32(a)
        v = (cos * dy - sin * dx) / _f32(b)
        uc = np.clip(u, -1, 1)
        if self.taper:
            v = v / (1 - _f32(self.taper) * uc)
        a0, a1, a2, a3, a4 = (_f32(v_) for v_ in self.amps)
        f = [_f32(v_) for v_ in self.freqs]
        ph = [_f32(v_) for v_ in self.phases]
        inplane = (
            np.abs(u) ** _f32(self.p)
            + np.abs(v) ** _f32(self.p)
            + a0 * np.sin(f[0] * u + ph[0])
            + a1 * np.sin(f[1] * v + ph[1])
            + a2 * np.sin(f[2] * u + f[3] * v + ph[2])
        )
        w = (z - _f32(cz)) / _f32(c)
        along = np.abs(w) ** _f32(self.q) + a3 * np.sin(f[4] * w + ph[3])
        cross_xy = a4 * np.sin(f[5] * u + f[6] * v + ph[4])
        cross_z = np.sin(f[7] * w + ph[5])
        if self.z_taper:
            gain = 1 + _f32(self.z_taper) * np.clip(uc, 0, 1)
            level = inplane + along * gain + cross_xy * cross_z
        else:
            level = inplane + along + cross_xy * cross_z
        return level < 1


@dataclass(frozen=True)
class Capsule:
    """A straight tube segment with linearly tapering radius (vessels, the aorta)."""

    a: tuple[float, float, float]
    b: tuple[float, float, float]
    ra: float
    rb: float

    def bbox(self) -> tuple[Array, Array]:
        r = max(self.ra, self.rb)
        pa, pb = np.asarray(self.a), np.asarray(self.b)
        return np.minimum(pa, pb) - r, np.maximum(pa, pb) + r

    def contains(self, x: Array, y: Array, z: Array) -> Array:
        ax, ay, az = (_f32(v) for v in self.a)
        ux, uy, uz = (_f32(b - a) for a, b in zip(self.a, self.b, strict=True))
        inv = _f32(1.0 / max(1e-9, float(ux * ux + uy * uy + uz * uz)))
        dx, dy, dz = x - ax, y - ay, z - az
        t = np.clip((dx * ux + dy * uy) * inv + dz * (uz * inv), 0, 1)
        ex, ey, ez = dx - t * ux, dy - t * uy, dz - t * uz
        r = _f32(self.ra) + t * _f32(self.rb - self.ra)
        return ex * ex + ey * ey + ez * ez < r * r


@dataclass(frozen=True)
class Ellipsoid:
    """Axis-aligned ellipsoid (lesions)."""

    centre: tuple[float, float, float]
    semi: tuple[float, float, float]

    def bbox(self) -> tuple[Array, Array]:
        c, h = np.asarray(self.centre), np.asarray(self.semi)
        return c - h, c + h

    def contains(self, x: Array, y: Array, z: Array) -> Array:
        (cx, cy, cz), (a, b, c) = self.centre, self.semi
        inplane = ((x - _f32(cx)) / _f32(a)) ** 2 + ((y - _f32(cy)) / _f32(b)) ** 2
        return inplane + ((z - _f32(cz)) / _f32(c)) ** 2 <= 1


@dataclass(frozen=True)
class BodyContour:
    """Superelliptic torso cross-section whose size varies smoothly along z.

    ``radius(x, y)`` is a normalised superelliptic radius (1 on the nominal skin);
    a layer ``inset_mm`` below the skin is ``radius < sigma(z) - inset_mm / mean_axis``,
    so every layer costs one comparison per voxel.
    """

    half_width: float
    half_ap_anterior: float
    half_ap_posterior: float
    p: float
    mod_amps: tuple[float, float] = (0.0, 0.0)
    mod_periods: tuple[float, float] = (300.0, 150.0)
    mod_phases: tuple[float, float] = (0.0, 0.0)
    neck_z: float = 205.0

    @property
    def mean_axis(self) -> float:
        return (self.half_width + (self.half_ap_anterior + self.half_ap_posterior) / 2) / 2

    @property
    def sigma_max(self) -> float:
        return 1.0 + sum(abs(a) for a in self.mod_amps)

    def radius(self, x: Array, y: Array) -> Array:
        p = _f32(self.p)
        b = np.where(y < 0, _f32(self.half_ap_anterior), _f32(self.half_ap_posterior))
        rx = (np.abs(x) / _f32(self.half_width)) ** p
        ry = (np.abs(y) / b.astype(np.float32)) ** p
        return (rx + ry) ** (1 / p)

    def sigma(self, z: Array) -> Array:
        z = np.asarray(z, np.float32)
        s = np.ones_like(z)
        for amp, period, phase in zip(
            self.mod_amps, self.mod_periods, self.mod_phases, strict=True
        ):
            s = s + _f32(amp) * np.sin(_f32(2 * np.pi / period) * z + _f32(phase))
        t = np.clip((z - _f32(self.neck_z)) / _f32(60.0), 0, 1)
        neck = 1 - _f32(0.4) * t * t * (3 - 2 * t)
        return (s * neck).astype(np.float32)

    def threshold(self, z: Array, inset_mm: float) -> Array:
        return self.sigma(z) - _f32(inset_mm / self.mean_axis)

    def inside(self, x: Array, y: Array, z: Array, inset_mm: float = 0.0) -> Array:
        return self.radius(x, y) < self.threshold(z, inset_mm)

    def bbox(self) -> tuple[Array, Array]:
        m = self.sigma_max
        lo = np.array([-self.half_width * m, -self.half_ap_anterior * m, -1e6])
        hi = np.array([self.half_width * m, self.half_ap_posterior * m, 1e6])
        return lo, hi
