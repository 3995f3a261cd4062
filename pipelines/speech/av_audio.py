"""Audio that libsndfile cannot read, decoded by PyAV (its wheels bundle FFmpeg's decoders, so no
system ffmpeg is needed): m4a/mp4/aac as phones and Zoom record, webm/mkv and opus as browsers
record, mp3, wma, amr, and the audio track of a video file.

A leaf module (audio.py calls it; its header probe lives in tasks/audio_files.py): it streams the
file's first audio stream as float32 mono blocks at the file's own rate, one block held at a time,
whatever the length; audio.py resamples them as it does soundfile's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np


def probe(path: str | Path) -> tuple[int, int, int | None, str]:
    """The header probe, kept in tasks/audio_files.py so that a job checks it before any model
    loads; see ``av_probe`` there."""
    from taskrun.tasks.audio_files import av_probe

    return av_probe(path)


def blocks(path: str | Path, block: int, rate: int) -> Iterator[np.ndarray]:
    """The first audio stream as float32 mono blocks of ``block`` samples at ``rate`` Hz (the
    last one shorter). Channels are averaged, as soundfile's reader does in audio.py; a stream
    whose rate changes part-way is brought back to ``rate`` by FFmpeg's resampler."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        stream.thread_type = "AUTO"
        to_float = av.AudioResampler(format="fltp", rate=rate)  # planar float: (channels, samples)
        pending: list[np.ndarray] = []
        held = 0
        try:
            for frame in _frames(container, stream):
                for out in to_float.resample(frame):
                    x = out.to_ndarray()
                    mono = x.mean(axis=0, dtype=np.float32) if x.shape[0] > 1 else x[0]
                    pending.append(np.ascontiguousarray(mono, dtype=np.float32))
                    held += len(mono)
                    while held >= block:
                        joined = np.concatenate(pending)
                        yield joined[:block]
                        pending, held = [joined[block:]], len(joined) - block
        except Exception:
            if held:  # what decoded before the damage is audio all the same (a recording cut short)
                yield np.concatenate(pending)
            raise
        for out in to_float.resample(None):  # what the resampler still holds
            x = out.to_ndarray()
            pending.append(np.ascontiguousarray(x.mean(axis=0, dtype=np.float32)))
        rest = np.concatenate(pending) if pending else np.zeros(0, np.float32)
        for i in range(0, len(rest), block):
            yield rest[i : i + block]


def _frames(container, stream) -> Iterator:
    """Decoded frames of ``stream``; the packets of other streams (video) are read and dropped."""
    for packet in container.demux(stream):
        yield from packet.decode()
