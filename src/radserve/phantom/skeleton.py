"""Bones and other structures that are not simple blobs: spine, ribs, diaphragm, table."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from radserve.phantom.shapes import Array, BodyContour, PixelFilter


def _f32(value: float) -> np.float32:
    return np.float32(value)


@dataclass(frozen=True)
class Diaphragm:
    """Two paraboloid domes; the right one (under the liver) sits higher."""

    right: tuple[float, float, float]  # (x, y, top z) of the right dome
    left: tuple[float, float, float]
    curvature_x: float = 80.0  # mm; the dome drops d^2 / (2 * curvature) away from its top
    curvature_y: float = 100.0

    def height(self, x: Array, y: Array) -> Array:
        """Body-frame z of the diaphragm surface above (x, y)."""
        kx, ky = _f32(0.5 / self.curvature_x), _f32(0.5 / self.curvature_y)
        domes = []
        for cx, cy, top in (self.right, self.left):
            domes.append(_f32(top) - kx * (x - _f32(cx)) ** 2 - ky * (y - _f32(cy)) ** 2)
        return np.maximum(domes[0], domes[1])


@dataclass(frozen=True)
class Box2D:
    """An in-plane rectangle extending along all z (the scanner table's layers)."""

    x0: float
    x1: float
    y0: float
    y1: float

    def bbox(self) -> tuple[Array, Array]:
        return np.array([self.x0, self.y0, -1e6]), np.array([self.x1, self.y1, 1e6])

    def contains(self, x: Array, y: Array, z: Array) -> Array:
        return (x >= self.x0) & (x <= self.x1) & (y >= self.y0) & (y <= self.y1)


@dataclass(frozen=True)
class Spine:
    """Vertebral bodies (cortex + cancellous), discs, canal and posterior elements.

    Vertebrae repeat along z with ``period`` (vertebra + ``disc``); their size grows
    linearly from thoracic (``z >= 100``) to lumbar (``z <= -100``) values.
    """

    x0: float
    y_canal: float
    canal_r: float = 8.0
    arch_r: float = 14.0
    half_width: tuple[float, float] = (16.0, 24.0)  # thoracic, lumbar
    half_ap: tuple[float, float] = (13.0, 17.0)
    period: float = 27.0
    disc: float = 6.0
    phase: float = 0.0
    cortex: float = 2.0
    spinous_len: float = 26.0
    transverse_len: float = 34.0

    def _axes(self, z: Array) -> tuple[Array, Array]:
        t = np.clip((_f32(100.0) - z) / _f32(200.0), 0, 1)
        a = _f32(self.half_width[0]) + t * _f32(self.half_width[1] - self.half_width[0])
        b = _f32(self.half_ap[0]) + t * _f32(self.half_ap[1] - self.half_ap[0])
        return a, b

    def bbox(self) -> tuple[Array, Array]:
        half_x = max(self.transverse_len, max(self.half_width)) + 1
        y_front = self.y_canal - self.canal_r - 1 - 2 * max(self.half_ap) - 1
        y_back = self.y_canal + self.arch_r + self.spinous_len + 1
        return (
            np.array([self.x0 - half_x, y_front, -1e6]),
            np.array([self.x0 + half_x, y_back, 1e6]),
        )

    def parts(self, x: Array, y: Array, z: Array) -> dict[str, Array]:
        """Masks of each part; in-plane parts are 2-D and broadcast on painting."""
        a, b = self._axes(z)
        yc = _f32(self.y_canal - self.canal_r - 1) - b
        dx = x - _f32(self.x0)
        dy = y - yc
        body = (dx / a) ** 2 + (dy / b) ** 2 < 1
        c = _f32(self.cortex)
        inner = (dx / (a - c)) ** 2 + (dy / (b - c)) ** 2 < 1
        phase = np.mod(z - _f32(self.phase), _f32(self.period))
        vertebra = phase < _f32(self.period - self.disc)
        endplate = (phase < c) | (phase > _f32(self.period - self.disc) - c)
        yk = y - _f32(self.y_canal)
        r2 = dx * dx + yk * yk
        canal = r2 < _f32(self.canal_r**2)
        arch = r2 < _f32(self.arch_r**2)
        spinous = (np.abs(dx) < 4) & (yk > 0) & (yk < _f32(self.arch_r + self.spinous_len))
        transverse = (np.abs(dx) < _f32(self.transverse_len)) & (np.abs(yk) < 4.5)
        posterior = (arch | spinous | transverse) & ~canal
        return {
            "disc": body & ~vertebra,
            "cortex": body & vertebra,
            "cancellous": inner & vertebra & ~endplate,
            "posterior": posterior & vertebra,
            "canal": canal,
        }


@dataclass(frozen=True)
class Ribs:
    """Twelve rib arcs in the chest wall, descending from back to front.

    Rib ``k`` is centred at ``z_top - k * period`` next to the spine and drops by
    ``drop`` towards the front; it spans the angles between a gap at the spine and a
    gap at the sternum (costal cartilage), the gap widening for the lower ribs.
    """

    body: BodyContour
    outer_inset: float
    thickness: float
    z_top: float
    period: float
    height: float = 10.0
    count: int = 12
    drop: float = 40.0
    spine_gap: float = 0.22
    sternum_gap: float = 0.55
    sternum_gap_step: float = 0.2

    def bbox(self) -> tuple[Array, Array]:
        lo, hi = self.body.bbox()
        lo[2] = self.z_top - (self.count - 1) * self.period - self.drop - self.height
        hi[2] = self.z_top + self.height
        return lo, hi

    def pixel_filter(self) -> PixelFilter:
        """Superset of the ring of pixels any rib can occupy (for speed)."""
        lo, hi = self.bbox()
        z = np.arange(lo[2], hi[2] + 1.0, 0.5, dtype=np.float32)
        r_in = float(self.body.threshold(z, self.outer_inset + self.thickness).min()) - 0.01
        r_out = float(self.body.threshold(z, self.outer_inset).max()) + 0.01

        def ring(x: Array, y: Array) -> Array:
            r = self.body.radius(x, y)
            return (r >= r_in) & (r <= r_out)

        return ring

    def contains(self, x: Array, y: Array, z: Array) -> Array:
        r = self.body.radius(x, y)
        theta = np.arctan2(x, y)  # 0 at the spine (posterior), +-pi at the sternum
        drop = _f32(self.drop / 2) * (1 - np.cos(theta))
        outer = self.body.threshold(z, self.outer_inset)
        inner = self.body.threshold(z, self.outer_inset + self.thickness)
        u = (z - _f32(self.z_top) + drop) / _f32(self.period)
        k = np.rint(-u)
        band = np.abs(u + k) < _f32(self.height / 2 / self.period)
        gap = _f32(self.sternum_gap) + _f32(self.sternum_gap_step) * np.maximum(k - 6, 0)
        angle = np.abs(theta)
        inside = (r < outer) & (r >= inner) & band & (k >= 0) & (k < self.count)
        return inside & (angle > _f32(self.spine_gap)) & (angle < _f32(np.pi) - gap)
