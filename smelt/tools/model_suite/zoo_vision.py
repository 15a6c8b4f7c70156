"""CNNs and vision transformers from timm, random weights (pretrained=False), dropout 0.

Each entry names the timm model and the overrides of each size. `tiny` keeps every kind of block
the real network has (one of each stage, few channels) on 32x32 or 64x64 images; `real` is the
network as published on 224x224 images, batch 32.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .spec import ModelSpec, Sample, register

NUM_CLASSES = {"tiny": 10, "real": 1000}
BATCH = {"tiny": 2, "real": 32}


def _timm():
    from .torchvision_stub import install_if_missing
    install_if_missing()
    import timm
    return timm


def _create(name: str, **overrides):
    return _timm().create_model(name, pretrained=False, drop_rate=0.0, **overrides)


def _resnet_tiny(block: str):
    _timm()
    from timm.models.resnet import BasicBlock, Bottleneck, ResNet
    if block == "basic":
        return ResNet(BasicBlock, (1, 1, 1, 1), num_classes=10, channels=(8, 16, 16, 32), stem_width=8)
    return ResNet(Bottleneck, (1, 1, 1, 1), num_classes=10, channels=(4, 8, 8, 16), stem_width=8)


def _efficientnet(size):
    _timm()
    from timm.models.efficientnet import _gen_efficientnet
    if size == "real":
        return _create("efficientnet_b0")
    # every stage's block kind (depthwise, inverted residual with squeeze-excite) once, 1/4 the channels
    return _gen_efficientnet("efficientnet_b0", channel_multiplier=0.25, depth_multiplier=0.1,
                             pretrained=False, num_classes=10, drop_rate=0.0)


def _mobilenetv3(size):
    _timm()
    from timm.models.mobilenetv3 import _gen_mobilenet_v3
    if size == "real":
        return _create("mobilenetv3_large_100")
    return _gen_mobilenet_v3("mobilenetv3_small_100", channel_multiplier=0.25, depth_multiplier=0.3,
                             pretrained=False, num_classes=10, drop_rate=0.0)


def _regnet(size):
    _timm()
    from timm.models.regnet import RegNet, RegNetCfg
    if size == "real":
        return _create("regnety_016")
    cfg = RegNetCfg(depth=4, w0=8, wa=12.0, wm=1.5, group_size=8, se_ratio=0.25, stem_width=8)
    return RegNet(cfg, num_classes=10, drop_rate=0.0)


def _densenet(size):
    _timm()
    from timm.models.densenet import DenseNet
    if size == "real":
        return _create("densenet121")
    return DenseNet(growth_rate=4, block_config=(1, 2), num_classes=10, bn_size=2, drop_rate=0.0)


TIMM_TINY = {
    "convnext": ("convnext_atto", dict(depths=(1, 1, 1, 1), dims=(8, 16, 16, 32))),
    "vit": ("vit_tiny_patch16_224", dict(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2)),
    "deit": ("deit_tiny_distilled_patch16_224",
             dict(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2)),
    "swin": ("swin_tiny_patch4_window7_224",
             dict(img_size=32, patch_size=4, window_size=4, embed_dim=16, depths=(1, 1), num_heads=(1, 2))),
}
TIMM_REAL = {
    "resnet18": "resnet18", "resnet50": "resnet50", "convnext": "convnext_tiny",
    "vit": "vit_base_patch16_224", "deit": "deit_small_distilled_patch16_224",
    "swin": "swin_tiny_patch4_window7_224",
}


def _builder(name: str):
    def build(size: str) -> torch.nn.Module:
        if size == "real":
            return _create(TIMM_REAL[name])
        if name == "resnet18":
            return _resnet_tiny("basic")
        if name == "resnet50":
            return _resnet_tiny("bottleneck")
        timm_name, overrides = TIMM_TINY[name]
        return _create(timm_name, num_classes=10, **overrides)
    return build


def _images(image_size: int):
    def sample(size: str, seq_len=None, generator=None) -> Sample:
        hw = image_size if size == "tiny" else 224
        images = torch.randn(BATCH[size], 3, hw, hw, generator=generator)
        labels = torch.randint(0, NUM_CLASSES[size], (BATCH[size],), generator=generator)
        return Sample({"x": images}, labels)
    return sample


def classification_loss(model, sample: Sample) -> torch.Tensor:
    logits = model(**sample.kwargs)
    if isinstance(logits, tuple):  # a distilled ViT in training returns (head, distillation head)
        return sum(F.cross_entropy(x.float(), sample.labels) for x in logits)
    return F.cross_entropy(logits.float(), sample.labels)


# name: (family, builder, tiny image side). 32x32 leaves a 1x1 map after a CNN's five halvings.
# Nets with batch norm get 64x64: over a 1x1 map of batch 2, batch norm normalizes two values per
# channel, and (a - b) / sqrt(var + eps) amplifies rounding differences up to 1/sqrt(eps) = 316x,
# so compiled and eager results differ by chance (efficientnet's loss, 2-5x eager's error).
_VISION = {
    "resnet18": ("cnn", _builder("resnet18"), 64),
    "resnet50": ("cnn", _builder("resnet50"), 64),
    "convnext": ("cnn", _builder("convnext"), 32),
    "efficientnet": ("cnn", _efficientnet, 64),
    "mobilenetv3": ("cnn", _mobilenetv3, 64),
    "regnet": ("cnn", _regnet, 64),
    "densenet": ("cnn", _densenet, 64),
    "vit": ("vit", _builder("vit"), 32),
    "deit": ("vit", _builder("deit"), 32),
    "swin": ("vit", _builder("swin"), 32),
}

for _name, (_family, _build, _side) in _VISION.items():
    register(ModelSpec(_name, _family, _build, _images(_side), classification_loss, requires="timm"))
