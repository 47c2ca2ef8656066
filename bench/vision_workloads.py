"""Vision and convolution workloads for bench/memory_accuracy.py.

``vit``: ViT-B/16 at 224x224 (patch 16, width 768, depth 12, 12 heads, 1000 classes), bf16
autocast and fused AdamW, as the memory figures of the hardening work were taken. ``impl="timm"``
builds timm's ``vit_base_patch16_224`` (no weights downloaded); ``impl="standin"`` builds a
timm-free model of the same structure (a Conv2d patch embedding, an ``nn.Sequential`` of blocks
with a ``fused_attn`` attribute, SDPA attention, a LayerNorm and a linear head), for machines
without timm. ``convnet``: timm's ``resnet50`` or a timm-free ResNet-style stand-in (conv,
BatchNorm, ReLU, residual bottlenecks), for the convolution workspaces.

``size="tiny"`` shrinks every shape so that a step runs on a CPU in a second.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from levers import Workload

NUM_CLASSES = 1000


def _has_timm() -> bool:
    try:
        import timm  # noqa: F401
    except Exception:  # noqa: BLE001 - timm present but broken counts as absent
        return False
    return True


class _Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.fused_attn = True  # as timm's Attention: SDPA when True, explicit softmax else
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        if self.fused_attn:
            x = F.scaled_dot_product_attention(q, k, v)
        else:
            x = (q @ k.transpose(-2, -1) * (c // self.heads) ** -0.5).softmax(-1) @ v
        return self.proj(x.transpose(1, 2).reshape(b, n, c))


class _Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), _Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class StandInViT(nn.Module):
    def __init__(self, image: int, patch: int, dim: int, depth: int, heads: int) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, (image // patch) ** 2 + 1, dim))
        self.blocks = nn.Sequential(*(_Block(dim, heads) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return self.head(self.norm(self.blocks(x))[:, 0])


class _Bottleneck(nn.Module):
    def __init__(self, width: int, inner: int, stride: int) -> None:
        super().__init__()
        out = 4 * inner
        self.body = nn.Sequential(
            nn.Conv2d(width, inner, 1, bias=False), nn.BatchNorm2d(inner), nn.ReLU(),
            nn.Conv2d(inner, inner, 3, stride, 1, bias=False), nn.BatchNorm2d(inner), nn.ReLU(),
            nn.Conv2d(inner, out, 1, bias=False), nn.BatchNorm2d(out),
        )
        self.skip = (
            nn.Identity()
            if stride == 1 and width == out
            else nn.Sequential(nn.Conv2d(width, out, 1, stride, bias=False), nn.BatchNorm2d(out))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.skip(x))


class StandInResNet(nn.Module):
    def __init__(self, stages: tuple[int, ...], base: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, base, 7, 2, 3, bias=False), nn.BatchNorm2d(base), nn.ReLU(),
            nn.MaxPool2d(3, 2, 1),
        )
        layers, width = [], base
        for index, count in enumerate(stages):
            inner = base * 2**index
            for block in range(count):
                layers.append(_Bottleneck(width, inner, 2 if block == 0 and index else 1))
                width = 4 * inner
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(width, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(self.stem(x)).mean((2, 3)))


def _workload(model, name, device, batch_size, image, params) -> Workload:
    model = model.to(device)
    fused = torch.device(device).type == "cuda"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused or None)
    images = torch.randn(batch_size, 3, image, image, device=device)
    labels = torch.randint(0, NUM_CLASSES, (batch_size,), device=device)
    autocast = torch.device(device).type == "cuda"

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return Workload(
        model=model, step=step, optimizer=optimizer, tokens_per_step=batch_size, name=name,
        params=params,
    )


def vit(device="cpu", batch_size=64, size="b16", impl="auto", seed=0, fused_attn=True) -> Workload:
    """``fused_attn`` off writes attention out as matmul-softmax-matmul (timm's switch)."""
    torch.manual_seed(seed)
    fused = str(fused_attn).lower() not in ("false", "0", "no", "off")
    impl = ("timm" if _has_timm() else "standin") if impl == "auto" else impl
    image, patch, dim, depth, heads = (224, 16, 768, 12, 12) if size == "b16" else (32, 8, 32, 2, 2)
    if impl == "timm":
        import timm

        model = timm.create_model(
            "vit_base_patch16_224" if size == "b16" else "vit_tiny_patch16_224",
            pretrained=False, img_size=image, patch_size=patch,
        )
    else:
        model = StandInViT(image, patch, dim, depth, heads)
    for module in model.modules():
        if hasattr(module, "fused_attn"):
            module.fused_attn = fused
    params = {"batch_size": batch_size, "size": size, "impl": impl, "fused_attn": fused}
    return _workload(model, f"vit-{size}-{impl}", device, batch_size, image, params)


def convnet(device="cpu", batch_size=64, size="resnet50", impl="auto", seed=0) -> Workload:
    torch.manual_seed(seed)
    impl = ("timm" if _has_timm() else "standin") if impl == "auto" else impl
    image = 224 if size == "resnet50" else 32
    if impl == "timm" and size == "resnet50":
        import timm

        model = timm.create_model("resnet50", pretrained=False)
    else:
        model = StandInResNet((3, 4, 6, 3), 64) if size == "resnet50" else StandInResNet((1, 1), 8)
    params = {"batch_size": batch_size, "size": size, "impl": impl}
    return _workload(model, f"convnet-{size}-{impl}", device, batch_size, image, params)
