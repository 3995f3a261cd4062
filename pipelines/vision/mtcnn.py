"""MTCNN face detection (Zhang et al. 2016) in plain torch.

The weights are facenet-pytorch's P-, R- and O-net state dicts, read from the installed package's
``data/*.pt`` files. Its code is not imported: it imports torchvision, whose wheels here need a
CUDA build of torch. The three nets are small enough to rebuild below, and non-maximum
suppression is a few lines of torch.

The cascade: P-net proposes candidate windows over an image pyramid; R-net rejects most of them
and refines the rest at 24×24; O-net scores, refines and places five landmarks at 48×48.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

STAGE_THRESHOLDS = (0.6, 0.7, 0.7)  # P-, R-, O-net: the published defaults
PYRAMID_FACTOR = 0.709  # each pyramid level is ~half the area of the last


class _Net(nn.Module):
    """A trunk of conv → PReLU (→ max-pool) stages, named conv1, prelu1, pool1, conv2, ... as in
    facenet-pytorch's state dicts; each row of ``stages`` is (in, out, kernel, pool or None)."""

    def __init__(self, stages):
        super().__init__()
        self._trunk = []  # the same modules, in order, without a getattr per stage per call
        for i, (cin, cout, kernel, pool) in enumerate(stages, 1):
            conv, prelu = nn.Conv2d(cin, cout, kernel), nn.PReLU(cout)
            setattr(self, f"conv{i}", conv)
            setattr(self, f"prelu{i}", prelu)
            if pool is not None:
                pool = nn.MaxPool2d(*pool, ceil_mode=True)
                setattr(self, f"pool{i}", pool)
            self._trunk.append((conv, prelu, pool))

    def trunk(self, x):
        for conv, prelu, pool in self._trunk:
            x = prelu(conv(x))
            if pool is not None:
                x = pool(x)
        return x


def _flat(x):
    # The weights were converted from Caffe, which flattens width-first.
    return x.permute(0, 3, 2, 1).reshape(x.shape[0], -1)


class PNet(_Net):
    def __init__(self):
        super().__init__([(3, 10, 3, (2, 2)), (10, 16, 3, None), (16, 32, 3, None)])
        self.conv4_1 = nn.Conv2d(32, 2, 1)
        self.conv4_2 = nn.Conv2d(32, 4, 1)

    def forward(self, x):
        x = self.trunk(x)
        return self.conv4_2(x), torch.softmax(self.conv4_1(x), dim=1)


class RNet(_Net):
    def __init__(self):
        super().__init__([(3, 28, 3, (3, 2)), (28, 48, 3, (3, 2)), (48, 64, 2, None)])
        self.dense4, self.prelu4 = nn.Linear(576, 128), nn.PReLU(128)
        self.dense5_1 = nn.Linear(128, 2)
        self.dense5_2 = nn.Linear(128, 4)

    def forward(self, x):
        x = self.prelu4(self.dense4(_flat(self.trunk(x))))
        return self.dense5_2(x), torch.softmax(self.dense5_1(x), dim=1)


class ONet(_Net):
    def __init__(self):
        super().__init__([(3, 32, 3, (3, 2)), (32, 64, 3, (3, 2)), (64, 64, 3, (2, 2)), (64, 128, 2, None)])
        self.dense5, self.prelu5 = nn.Linear(1152, 256), nn.PReLU(256)
        self.dense6_1 = nn.Linear(256, 2)
        self.dense6_2 = nn.Linear(256, 4)
        self.dense6_3 = nn.Linear(256, 10)

    def forward(self, x):
        x = self.prelu5(self.dense5(_flat(self.trunk(x))))
        return self.dense6_2(x), self.dense6_3(x), torch.softmax(self.dense6_1(x), dim=1)


def weights_dir() -> Path:
    """facenet-pytorch's data folder, found without importing the package."""
    spec = importlib.util.find_spec("facenet_pytorch")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("facenet_pytorch is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "data"


class MTCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.pnet, self.rnet, self.onet = PNet(), RNet(), ONet()

    @classmethod
    def from_folder(cls, folder: str | Path) -> MTCNN:
        """Load pnet.pt, rnet.pt and onet.pt from ``folder``; a missing or extra key is an error."""
        model = cls()
        for name in ("pnet", "rnet", "onet"):
            state = torch.load(Path(folder) / f"{name}.pt", map_location="cpu", weights_only=True)
            getattr(model, name).load_state_dict(state, strict=True)
        return model.eval()

    @property
    def dtype(self):
        return next(self.parameters()).dtype

    def detect(
        self, image: torch.Tensor, min_face: int = 20, thresholds: tuple[float, float, float] = STAGE_THRESHOLDS
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Faces in one image (uint8 or float tensor, 3×H×W, RGB 0-255).

        Returns (boxes N×5 as x0, y0, x1, y1, score, best first; landmarks N×5×2), in pixels.
        """
        img = image.to(self.dtype).unsqueeze(0)
        h, w = img.shape[2:]
        boxes = self._propose(img, min_face, thresholds[0])
        if len(boxes):
            boxes = self._refine(img, boxes, thresholds[1])
        if not len(boxes):
            return torch.zeros(0, 5), torch.zeros(0, 5, 2)
        boxes, points = self._output(img, boxes, thresholds[2])
        order = boxes[:, 4].argsort(descending=True)
        boxes, points = boxes[order].float().cpu(), points[order].float().cpu()
        boxes[:, 0:4:2] = boxes[:, 0:4:2].clamp(0, w)  # a face cut by the edge ends at the edge
        boxes[:, 1:4:2] = boxes[:, 1:4:2].clamp(0, h)
        return boxes, points

    # ----------------------------------------------------------------- the three stages

    def _propose(self, img, min_face, threshold):
        h, w = img.shape[2:]
        m = 12.0 / min_face  # P-net sees 12×12 windows: scale so the smallest face is 12 px
        scales, side = [], min(h, w) * m
        scale = m
        while side >= 12:
            scales.append(scale)
            scale *= PYRAMID_FACTOR
            side *= PYRAMID_FACTOR
        found = []
        for scale in scales:
            x = _normalise(F.interpolate(img, size=(int(h * scale + 1), int(w * scale + 1)), mode="area"))
            reg, probs = self.pnet(x)
            cand = _windows(reg[0], probs[0, 1], scale, threshold)
            if len(cand):
                found.append(cand[nms(cand[:, :4], cand[:, 4], 0.5)])
        if not found:
            return torch.zeros(0, 5, dtype=img.dtype)
        boxes = torch.cat(found)
        boxes = boxes[nms(boxes[:, :4], boxes[:, 4], 0.7)]
        bw, bh = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
        refined = torch.stack(
            [
                boxes[:, 0] + boxes[:, 5] * bw,
                boxes[:, 1] + boxes[:, 6] * bh,
                boxes[:, 2] + boxes[:, 7] * bw,
                boxes[:, 3] + boxes[:, 8] * bh,
                boxes[:, 4],
            ],
            1,
        )
        return _square(refined)

    def _refine(self, img, boxes, threshold):
        crops, boxes = _crops(img, boxes, 24)
        if not len(boxes):
            return boxes
        reg, probs = self.rnet(crops)
        keep = probs[:, 1] > threshold
        boxes = torch.cat([boxes[keep, :4], probs[keep, 1:2]], 1)
        reg = reg[keep]
        pick = nms(boxes[:, :4], boxes[:, 4], 0.7)
        return _square(_regress(boxes[pick], reg[pick]))

    def _output(self, img, boxes, threshold):
        crops, boxes = _crops(img, boxes, 48)
        if not len(boxes):
            return boxes, torch.zeros(0, 5, 2)
        reg, marks, probs = self.onet(crops)
        keep = probs[:, 1] > threshold
        boxes = torch.cat([boxes[keep, :4], probs[keep, 1:2]], 1)
        reg, marks = reg[keep], marks[keep]
        bw = (boxes[:, 2] - boxes[:, 0] + 1).unsqueeze(1)
        bh = (boxes[:, 3] - boxes[:, 1] + 1).unsqueeze(1)
        points = torch.stack([bw * marks[:, :5] + boxes[:, :1] - 1, bh * marks[:, 5:] + boxes[:, 1:2] - 1], 2)
        boxes = _regress(boxes, reg)
        pick = nms(boxes[:, :4], boxes[:, 4], 0.7, mode="min")
        return boxes[pick], points[pick]


# --------------------------------------------------------------------------- box arithmetic


def _normalise(x):
    return (x - 127.5) * 0.0078125


def _windows(reg, prob, scale, threshold):
    """P-net's output map → candidate windows (x0, y0, x1, y1, score, 4 regression offsets)."""
    stride, cell = 2, 12
    rows, cols = torch.nonzero(prob >= threshold, as_tuple=True)
    if not len(rows):
        return torch.zeros(0, 9, dtype=prob.dtype)
    xy = torch.stack([cols, rows], 1).to(prob.dtype)
    q1 = ((stride * xy + 1) / scale).floor()
    q2 = ((stride * xy + cell) / scale).floor()
    return torch.cat([q1, q2, prob[rows, cols].unsqueeze(1), reg[:, rows, cols].T], 1)


def _regress(boxes, reg):
    w = boxes[:, 2] - boxes[:, 0] + 1
    h = boxes[:, 3] - boxes[:, 1] + 1
    out = boxes.clone()
    out[:, 0] = boxes[:, 0] + reg[:, 0] * w
    out[:, 1] = boxes[:, 1] + reg[:, 1] * h
    out[:, 2] = boxes[:, 2] + reg[:, 2] * w
    out[:, 3] = boxes[:, 3] + reg[:, 3] * h
    return out


def _square(boxes):
    """Grow each box to a square around its centre: the next net takes square crops."""
    w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    side = torch.maximum(w, h)
    out = boxes.clone()
    out[:, 0] = boxes[:, 0] + w * 0.5 - side * 0.5
    out[:, 1] = boxes[:, 1] + h * 0.5 - side * 0.5
    out[:, 2] = out[:, 0] + side
    out[:, 3] = out[:, 1] + side
    return out


def _crops(img, boxes, size):
    """Each box cut from the image (clipped to it) and resized to size×size, with the boxes that
    had a non-empty crop."""
    h, w = img.shape[2:]
    b = boxes[:, :4].trunc().int().tolist()
    crops, keep = [], []
    for k, (x0, y0, x1, y1) in enumerate(b):
        x0, y0, x1, y1 = max(x0, 1), max(y0, 1), min(x1, w), min(y1, h)
        if x1 > x0 - 1 and y1 > y0 - 1:
            crop = img[:, :, y0 - 1 : y1, x0 - 1 : x1]
            if crop.shape[2] and crop.shape[3]:
                crops.append(F.interpolate(crop, size=(size, size), mode="area"))
                keep.append(k)
    if not crops:
        return torch.zeros(0, 3, size, size, dtype=img.dtype), boxes[:0]
    return _normalise(torch.cat(crops)), boxes[keep]


def nms(boxes: torch.Tensor, scores: torch.Tensor, threshold: float, mode: str = "union") -> torch.Tensor:
    """Greedy non-maximum suppression: indexes of the boxes kept, best score first.

    ``union`` drops a box whose intersection-over-union with a kept one exceeds ``threshold``;
    ``min`` uses intersection over the smaller box (drops boxes nested inside a kept one), with
    the +1 pixel areas of the original MTCNN code.
    """
    if not len(boxes):
        return torch.zeros(0, dtype=torch.long)
    boxes = boxes.float()
    one = 1.0 if mode == "min" else 0.0
    x0, y0, x1, y1 = boxes.unbind(1)
    area = (x1 - x0 + one) * (y1 - y0 + one)
    order = scores.float().argsort(descending=True)
    keep = []
    while len(order):
        i = order[0]
        keep.append(i)
        rest = order[1:]
        iw = (torch.minimum(x1[i], x1[rest]) - torch.maximum(x0[i], x0[rest]) + one).clamp(min=0)
        ih = (torch.minimum(y1[i], y1[rest]) - torch.maximum(y0[i], y0[rest]) + one).clamp(min=0)
        inter = iw * ih
        if mode == "min":
            overlap = inter / torch.minimum(area[i], area[rest])
        else:
            overlap = inter / (area[i] + area[rest] - inter)
        order = rest[overlap <= threshold]
    return torch.stack(keep)
