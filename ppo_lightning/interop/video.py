"""MP4 files of an agent playing (``evaluate --video``, ``export-hf``'s ``replay.mp4``, training videos).

Encoded with PyAV (``pip install av``: the wheel carries its own FFmpeg libraries; H.264 through
libx264, ``yuv420p`` so that browsers and the Hub play it) and read back with imageio's PyAV plugin.
We do not use imageio's ``imageio-ffmpeg`` backend: Procgen's ``gym3`` pins ``imageio-ffmpeg<0.4``, whose 0.3.0
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
# x264's "veryfast" preset: ~4x less encoding time than the default "medium" for a slightly larger
# file (agents' videos are small either way); crf 23 is x264's default quality.
ENCODER_OPTIONS = {"preset": "veryfast", "crf": "23"}


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
        import av

        image = prepare_frames([frame])[0]
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = av.open(str(self.path), mode="w")
            self._stream = self._file.add_stream("libx264", rate=self.fps, options=ENCODER_OPTIONS)
            self._stream.height, self._stream.width = image.shape[:2]
            self._stream.pix_fmt = "yuv420p"
        self._file.mux(self._stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
        self.frames += 1

    def close(self) -> None:
        if self._file is not None:
            self._file.mux(self._stream.encode())  # flush the encoder
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
    with VideoWriter(path, fps=fps) as video:
        for frame in frames:
            video.write(frame)
    return video.path


def read_mp4(path: str | os.PathLike) -> np.ndarray:
    """Decode an MP4 into ``[T, H, W, 3]`` uint8 (tests, checks)."""
    import imageio.v3 as iio

    return iio.imread(Path(path), plugin="pyav")
