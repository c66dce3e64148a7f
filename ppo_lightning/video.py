"""MP4 files of an agent playing (``evaluate --video``, ``export-hf``'s ``replay.mp4``, training videos).

Encoded with imageio's PyAV plugin (``pip install imageio av``: both wheels carry their own FFmpeg
libraries, H.264 through libx264, ``yuv420p`` so that browsers and the Hub play it). We do not use
imageio's ``imageio-ffmpeg`` backend: Procgen's ``gym3`` pins ``imageio-ffmpeg<0.4``, whose 0.3.0
imports ``pkg_resources`` and fails on current setuptools.

Frames smaller than `MIN_SIDE` pixels (Procgen's 64x64 observations) are enlarged by an integer
factor with nearest-neighbour repetition so that they can be watched; odd sizes are padded to even
ones (H.264 with 4:2:0 chroma needs even width and height).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

MIN_SIDE = 256


class VideoWriter:
    """Streams frames into an H.264 MP4 (a long episode is never held in memory)::

        with VideoWriter("out.mp4", fps=30) as video:
            video.write(frame)          # RGB uint8 [H, W, 3]; every frame the size of the first
    """

    def __init__(self, path: str | os.PathLike, fps: int = 30) -> None:
        self.path, self.fps = Path(path), int(fps)
        self.frames = 0
        self._file = None

    def write(self, frame: np.ndarray) -> None:
        import imageio.v3 as iio

        image = prepare_frames([frame])[0]
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = iio.imopen(self.path, "w", plugin="pyav")
            self._file.init_video_stream("libx264", fps=self.fps, pixel_format="yuv420p")
        self._file.write_frame(image)
        self.frames += 1

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> "VideoWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def prepare_frames(frames: Sequence[np.ndarray]) -> np.ndarray:
    """``[T, H, W, 3]`` uint8, enlarged below `MIN_SIDE` and padded to even sizes."""
    if len(frames) == 0:
        raise ValueError("no frames to write")
    video = np.stack([np.asarray(f) for f in frames])
    if video.ndim != 4 or video.shape[-1] not in (3, 4):
        raise ValueError(f"frames must be [H, W, 3] RGB images, got shape {video.shape[1:]}")
    video = video[..., :3]
    if video.dtype != np.uint8:
        video = np.clip(video, 0, 255).astype(np.uint8)
    factor = max(1, -(-MIN_SIDE // max(video.shape[1], video.shape[2])))  # ceil
    if factor > 1:
        video = video.repeat(factor, axis=1).repeat(factor, axis=2)
    pad_h, pad_w = video.shape[1] % 2, video.shape[2] % 2
    if pad_h or pad_w:
        video = np.pad(video, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), mode="edge")
    return np.ascontiguousarray(video)


def write_mp4(path: str | os.PathLike, frames: Sequence[np.ndarray], fps: int = 30) -> Path:
    """Write ``frames`` (RGB uint8 ``[H, W, 3]``) as an H.264 MP4; returns the path."""
    import imageio.v3 as iio

    video = prepare_frames(frames)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    iio.imwrite(path, video, plugin="pyav", codec="libx264", fps=int(fps), out_pixel_format="yuv420p")
    return path


def read_mp4(path: str | os.PathLike) -> np.ndarray:
    """Decode an MP4 into ``[T, H, W, 3]`` uint8 (tests, checks)."""
    import imageio.v3 as iio

    return iio.imread(Path(path), plugin="pyav")
