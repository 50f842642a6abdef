"""Serving a checkpoint over HTTP with LitServe: the model side (`ViTAPI`, batched on the device) and the HTTP side
(`ImageRequests`, which turns an uploaded image into the model's input or a 4xx answer). The command is
vit/commands/serve.py (`vit-serve`); the page it serves at `/` is vit/static/index.html.

Why two halves: LitServe decodes requests inside the batch loop of its inference worker, where one exception fails
every request of the batch. Here the HTTP side (the API server process) reads, checks and decodes each image on its
own, the same way as vit-predict (vit.data.images, vit.data.images.image_at), answers bad input itself, and hands
the worker only a fixed-size uint8 image as JSON. The worker's batch never holds a bad request.

    POST /predict?topk=5&map=relevance   body: multipart (field `file`) or the raw image bytes (image/* content type)
    -> {"predictions": [{"label", "prob"}...], "map": base64 PNG or null, "batch": images in the forward}
"""

from __future__ import annotations

import base64
import io
import json
import os
from pathlib import Path
from urllib.parse import parse_qs

import litserve as ls
import torch
import torch.nn.functional as F
from PIL import Image
from starlette.requests import Request

from vit.data.images import describe, image_at, read_image, same_dtype
from vit.deployment.onnx_model import load_onnx
from vit.deployment.predict import channel_stats, labels_above, map_and_logits, normalize, top_k
from vit.deployment.processes import die_with_launcher, leave_terminal_group
from vit.evaluation.attention_maps import denormalize, overlay
from vit.evaluation.unknown import Rejector
from vit.model.checkpoint import load_model
from vit.model.record import CheckpointRecord

MAPS = ("none", "relevance", "rollout")
RAW_TYPES = ("image/", "application/octet-stream")
MAP_SIDE = 224  # the overlay's side in pixels: small images are upsampled before the map is drawn over them
FORMATS = ("PNG", "JPEG", "WEBP", "BMP", "GIF", "TIFF")  # what an upload may be; anything else is 415
INLINE_PIXELS = 256 * 256  # larger images are decoded in a thread, off the event loop (ImageRequests._decode)


class RequestError(Exception):
    """A request this server will not pass to the model: the HTTP status and a one-line reason."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


# ---------------------------------------------------------------------------------------------------------------------
# The HTTP side: runs in LitServe's API server process, one request at a time per request
# ---------------------------------------------------------------------------------------------------------------------


def decode_upload(data: bytes, img_size: int, in_chans: int, max_pixels: int) -> torch.Tensor:
    """Image bytes -> (in_chans, img_size, img_size), uint8 (float32 for 16-bit), as vit-predict reads a file;
    RequestError otherwise.

    Only FORMATS are opened (Pillow would also run EPS through Ghostscript, where installed). The size is checked on
    the header, after JPEG's draft scaling (which decodes only what img_size needs), before any pixel is decoded."""
    if not data:
        raise RequestError(400, "empty body: no image")
    try:
        return image_at(
            read_image(io.BytesIO(data), in_chans, max_pixels=max_pixels, formats=FORMATS, draft=img_size), img_size
        )
    except Image.DecompressionBombError as e:
        raise RequestError(413, f"image over the limit of {max_pixels} pixels ({describe(e)})") from None
    except Image.UnidentifiedImageError:
        raise RequestError(415, f"not an image of a served format ({', '.join(FORMATS)})") from None
    except Exception as e:  # truncated, corrupt
        raise RequestError(400, f"cannot read the image: {describe(e)}") from None


def query_options(query: str, max_topk: int) -> tuple[int, str, bool]:
    """`topk` (1 to the number of classes, default 5), `map` (none, relevance, rollout) and `raw` (1: the softmax
    without the calibration temperature) from the query string."""
    q = parse_qs(query)
    try:
        topk = int(q.get("topk", ["5"])[-1])
    except ValueError:
        raise RequestError(400, f"topk={q['topk'][-1]!r} is not a whole number") from None
    if topk < 1:
        raise RequestError(400, f"topk={topk} must be >= 1")
    kind = q.get("map", ["none"])[-1]
    if kind not in MAPS:
        raise RequestError(400, f"map={kind!r} is not one of {list(MAPS)}")
    raw = q.get("raw", ["0"])[-1]
    if raw not in ("0", "1"):
        raise RequestError(400, f"raw={raw!r} is not 0 or 1")
    return min(topk, max_topk), kind, raw == "1"


class ImageRequests:
    """ASGI middleware for `POST <path>`: the body within `max_bytes` (413), the image from a multipart upload (field
    `file`, or the only file) or from a raw body with an image/* or application/octet-stream type (else 415), decoded
    (400/413, see decode_upload), then passed on as JSON `{"pixels": base64 uint8, "topk": k, "map": kind}` for
    ViTAPI.decode_request. Every refusal is a JSON answer `{"error": "..."}`; other paths pass through untouched."""

    def __init__(
        self, app, *, path: str, img_size: int, in_chans: int, num_classes: int, max_bytes: int, max_pixels: int
    ):
        self.app, self.path = app, path
        self.img_size, self.in_chans, self.num_classes = img_size, in_chans, num_classes
        self.max_bytes, self.max_pixels = max_bytes, max_pixels

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] != self.path or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        try:
            topk, kind, raw = query_options(scope.get("query_string", b"").decode("latin-1"), self.num_classes)
            body = await self._body(scope, receive)
            data = await self._image_bytes(scope, body)
            pixels = await self._decode(data)
        except RequestError as e:
            await _json(send, e.status, {"error": str(e)})
            return
        payload = json.dumps(
            {
                "pixels": base64.b64encode(pixels.numpy().tobytes()).decode(),
                "dtype": str(pixels.dtype).removeprefix("torch."),  # uint8, or float32 for 16-bit uploads
                "topk": topk,
                "map": kind,
                "raw": raw,
            }
        ).encode()
        headers = [(k, v) for k, v in scope["headers"] if k not in (b"content-type", b"content-length")]
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
        await self.app({**scope, "headers": headers}, _replay(payload), send)

    async def _decode(self, data: bytes) -> torch.Tensor:
        """decode_upload on the event loop for an image of at most INLINE_PIXELS (the header says so before any pixel
        is decoded), in a thread otherwise: handing a 32 px PNG to a thread took 160 us, decoding it 65 us."""
        try:
            return decode_upload(data, self.img_size, self.in_chans, min(self.max_pixels, INLINE_PIXELS))
        except RequestError as e:
            if e.status != 413 or self.max_pixels <= INLINE_PIXELS:
                raise
        return await _in_thread(decode_upload, data, self.img_size, self.in_chans, self.max_pixels)

    async def _body(self, scope, receive) -> bytes:
        declared = dict(scope["headers"]).get(b"content-length")
        declared = int(declared) if declared is not None and declared.isdigit() else None
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise RequestError(400, "the client went away before the body was read")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                # Read the rest (not kept) when it is not much over, so that the client, still sending, gets the
                # answer instead of a broken pipe; far over, answer at once and let the connection close.
                while message.get("more_body", False) and size <= 4 * self.max_bytes:
                    message = await receive()
                    size += len(message.get("body", b""))
                shown = declared if declared is not None else f"over {self.max_bytes}"
                raise RequestError(413, f"body of {shown} bytes is over the limit of {self.max_bytes} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _image_bytes(self, scope, body: bytes) -> bytes:
        ctype = dict(scope["headers"]).get(b"content-type", b"").decode("latin-1").lower()
        if ctype.startswith("multipart/form-data"):
            try:
                form = await Request(scope, _replay(body)).form(
                    max_files=4, max_fields=16, max_part_size=self.max_bytes
                )
            except Exception as e:  # starlette's MultiPartException, a malformed boundary
                raise RequestError(400, f"malformed multipart body: {e}") from None
            try:
                files = [v for v in form.values() if hasattr(v, "read")]
                upload = (
                    form.get("file") if hasattr(form.get("file"), "read") else (files[0] if len(files) == 1 else None)
                )
                if upload is None:
                    raise RequestError(400, "multipart body has no file field 'file'")
                return await upload.read()
            finally:
                await form.close()  # the spooled temporary files of every part
        if ctype.startswith(RAW_TYPES):
            return body
        raise RequestError(
            415,
            f"content type {ctype or 'none'!r}: send the image as multipart/form-data (field 'file') or as the raw "
            "body with an image/* content type",
        )


LOOPBACK_NAMES = {"127.0.0.1", "localhost", "::1"}
WILDCARDS = ("0.0.0.0", "::")


def allowed_hosts(bind: str, extra: list[str] = ()) -> set[str] | None:
    """The names a request's Host header may carry: the bound address, the loopback names and `extra`
    (--allowed-host); None (any) for a server bound to every interface with no --allowed-host."""
    if bind in WILDCARDS and not extra:
        return None
    return LOOPBACK_NAMES | ({bind} if bind not in WILDCARDS else set()) | {h.lower() for h in extra}


def host_name(header: str) -> str:
    """The host of a Host header, without the port: 'localhost:8000' -> 'localhost', '[::1]:8000' -> '::1'."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class HostCheck:
    """ASGI middleware: a request whose Host header names no allowed host gets a 400 JSON error. A web page on any
    site can make a browser on this machine reach a server on localhost by DNS rebinding (its own name resolving to
    127.0.0.1); only the Host header then tells the request apart."""

    def __init__(self, app, *, allowed: set[str] | None):
        self.app, self.allowed = app, allowed

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and self.allowed is not None:
            host = host_name(dict(scope["headers"]).get(b"host", b"").decode("latin-1"))
            if host not in self.allowed:
                await _json(
                    send, 400, {"error": f"Host {host!r} is not served here (vit-serve --allowed-host adds it)"}
                )
                return
        await self.app(scope, receive, send)


class LeaveTerminalGroup:
    """ASGI middleware that does nothing to requests: built in each API-server process that LitServe forks (when the
    app starts), it moves that process out of the terminal's process group, so that Ctrl-C reaches the launcher
    alone, which stops every process it started (LitServe's graceful shutdown) and says so in a line. Without it each
    process got the SIGINT too and printed its own traceback (KeyboardInterrupt, CancelledError: 8 of them, 166
    lines). `launcher`: the pid of the process that runs `vit-serve` (with API servers as threads it builds the app
    itself and stays in the group)."""

    def __init__(self, app, *, launcher: int):
        self.app = app
        if os.getpid() != launcher:
            leave_terminal_group()
            die_with_launcher(launcher)

    async def __call__(self, scope, receive, send) -> None:
        await self.app(scope, receive, send)


def _replay(body: bytes):
    """An ASGI `receive` that hands over `body` once (already read), then says the client has gone."""
    sent = False

    async def receive():
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


_DECODERS = None  # anyio.CapacityLimiter, made in the event loop on first use


async def _in_thread(fn, *args):
    """Decode off the event loop (PIL releases the GIL), at most one decode per core at a time: the others wait for
    a thread instead of each holding a decoded image (anyio's default allows 40 threads; 24 concurrent uploads of a
    116-KB PNG that decodes to 6,000 x 6,000 took the server to 8.8 GB)."""
    import anyio

    global _DECODERS
    if _DECODERS is None:
        _DECODERS = anyio.CapacityLimiter(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2)
    return await anyio.to_thread.run_sync(fn, *args, limiter=_DECODERS)


async def _json(send, status: int, content: dict) -> None:
    body = json.dumps(content).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# ---------------------------------------------------------------------------------------------------------------------
# The model side: runs in LitServe's inference worker, on batches of requests
# ---------------------------------------------------------------------------------------------------------------------


def png_base64(image: torch.Tensor) -> str:
    """(3, H, W) float in [0, 1] -> base64 PNG."""
    pixels = image.mul(255).add_(0.5).clamp_(0, 255).to(torch.uint8).permute(1, 2, 0).cpu().numpy()
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def map_overlays(model, x: torch.Tensor, record: CheckpointRecord, kind: str) -> list[str]:
    """For normalised inputs (B, C, S, S): the map of the predicted class over each image, as base64 PNGs."""
    maps, _ = map_and_logits(model, x, kind)
    images = denormalize(x.float(), record.mean, record.std).cpu()
    side = max(MAP_SIDE, images.shape[-1])
    images = F.interpolate(images, size=(side, side), mode="bilinear", antialias=True).clamp_(0, 1)
    return [png_base64(overlay(img, m)) for img, m in zip(images, maps.cpu())]


class ViTAPI(ls.LitAPI):
    """LitServe's side of vit-serve: loads the checkpoint (as data, never code) on its device, classifies batches of
    decoded images, and draws the class-specific relevance (or rollout) of the predicted class where asked."""

    def __init__(
        self,
        ckpt: str | Path,
        max_batch_size: int = 32,
        batch_timeout: float = 0.01,
        onnx: bool = False,
        threads: int | None = None,
    ):
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout)
        self.ckpt, self.onnx = str(ckpt), onnx  # onnx: `ckpt` is an exported model (vit/deployment/onnx_model.py)
        # intra-op threads of this worker on a CPU (vit.commands.serve.worker_layout); None: torch's own count
        self.threads = threads
        self.batches: list[int] = []  # batch sizes seen, for tests and the bench (in the worker process)
        self.launcher = os.getpid()  # built by the launcher; set up in a worker process it starts

    def setup(self, device: str) -> None:
        if os.getpid() != self.launcher:  # an inference worker: the launcher stops it (see LeaveTerminalGroup)
            leave_terminal_group()
            die_with_launcher(self.launcher)
        if self.threads and device == "cpu":
            torch.set_num_threads(self.threads)  # this worker process's share of the cores
        self.model, self.record = load_onnx(self.ckpt, threads=self.threads) if self.onnx else load_model(self.ckpt)
        self.model = self.model.to(device).eval()
        self.device = torch.device(device)
        self.names = self.record.class_names
        self.shape = (self.record.in_chans, self.record.img_size, self.record.img_size)
        self.mean, self.std = channel_stats(self.record, self.device)  # once, on the device
        self.reject = Rejector(self.record.unknown)

    def decode_request(self, request: dict):
        dtype = torch.float32 if request.get("dtype") == "float32" else torch.uint8
        pixels = torch.frombuffer(bytearray(base64.b64decode(request["pixels"])), dtype=dtype)
        return pixels.reshape(self.shape), int(request["topk"]), request["map"], bool(request.get("raw"))

    def batch(self, inputs: list) -> list:
        return inputs  # predict stacks the images and keeps each request's options

    def predict(self, items: list) -> list[dict]:
        x = torch.stack(same_dtype([pixels for pixels, _, _, _ in items])).to(self.device, non_blocking=True)
        x = normalize(x, self.mean, self.std)  # (B, C, S, S)
        with torch.inference_mode():
            logits, feats = self.reject.forward(self.model, x)
        unknown = self.reject(logits, feats, self.reject.inputs(x)).tolist()  # the checkpoint's rejection, or False
        k_max = max(k for _, k, _, _ in items)
        if self.record.multilabel:  # each label's sigmoid, and the labels above their thresholds
            top, given = labels_above(logits, self.names, k_max, self.record.thresholds)
            out = [
                {"predictions": top[i][:k], "labels": given[i], "unknown": None, "map": None, "batch": len(items)}
                for i, (_, k, _, _) in enumerate(items)
            ]
        else:
            calibrated = top_k(logits, self.names, k_max, self.record.temperature)
            raw = top_k(logits, self.names, k_max) if any(r for _, _, _, r in items) else None
            out = [
                {
                    "predictions": (raw if r else calibrated)[i][:k],
                    "unknown": unknown[i],
                    "map": None,
                    "batch": len(items),
                }
                for i, (_, k, _, r) in enumerate(items)
            ]
        for kind in MAPS[1:]:
            idx = [i for i, (_, _, m, _) in enumerate(items) if m == kind]
            if idx and not self.onnx:  # an ONNX graph has no attention to read: "map" stays null
                for i, picture in zip(idx, map_overlays(self.model, x[idx], self.record, kind)):
                    out[i]["map"] = picture
        return out

    def unbatch(self, output: list) -> list:
        return output

    def encode_response(self, output: dict) -> dict:
        return output


def server_info(ckpt: str | Path, record: CheckpointRecord) -> dict:
    """What GET /info says about the model (LitServe puts it under "model")."""
    return {
        "classes": list(record.class_names),
        "img_size": record.img_size,
        "in_chans": record.in_chans,
        "mean": list(record.mean),
        "std": list(record.std),
        "arch": record.arch,  # null for an ONNX model: its sidecar describes the input, not the blocks
        "checkpoint": Path(ckpt).name,  # the file's name only: where it lives on the server is no client's business
        "temperature": record.temperature,  # probabilities are softmax(logits / temperature); ?raw=1
        # the score that says "unknown" (vit/evaluation/unknown.py), its threshold and fusion; null: never unknown
        "unknown": record.rejection(),
        # "multilabel": several labels an image, each given at or above its threshold (then under "labels")
        "task": record.task,
        "thresholds": record.thresholds,
    }
