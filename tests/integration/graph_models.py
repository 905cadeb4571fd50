#!/usr/bin/python3
"""Writes TorchScript files of models no one here wrote, and what PyTorch says about them, for
test_graph.cpp: torchvision's ResNet-18 (traced, weights=None) and a TransformerEncoderLayer
(traced). Prints one JSON object: per model its file, parameter count, output shape, op counts
and the multiply-adds of its Conv2d and Linear layers (from forward hooks).

  graph_models.py OUTDIR
"""
import json
import sys

import torch
import torchvision


def macs_and_counts(model, x):
    macs = 0
    counts = {"Conv2d": 0, "BatchNorm2d": 0, "Linear": 0, "LayerNorm": 0}

    def hook(m, inp, out):
        nonlocal macs
        if isinstance(m, torch.nn.Conv2d):
            macs += out.numel() * (m.in_channels // m.groups) * m.kernel_size[0] * m.kernel_size[1]
        elif isinstance(m, torch.nn.Linear):
            macs += out.numel() * m.in_features

    handles = []
    for m in model.modules():
        name = type(m).__name__
        if name in counts:
            counts[name] += 1
        if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)):
            handles.append(m.register_forward_hook(hook))
    with torch.no_grad():
        out = model(x)
    for h in handles:
        h.remove()
    return macs, counts, list(out.shape)


def main():
    outdir = sys.argv[1]
    torch.manual_seed(0)
    result = {}

    resnet = torchvision.models.resnet18(weights=None).eval()
    x = torch.rand(1, 3, 224, 224)
    macs, counts, shape = macs_and_counts(resnet, x)
    path = outdir + "/resnet18.pt"
    torch.jit.trace(resnet, x).save(path)
    result["resnet18"] = {"file": path, "parameters": sum(p.numel() for p in resnet.parameters()),
                          "output": shape, "macs": macs, "counts": counts}

    layer = torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True).eval()
    x = torch.rand(2, 10, 64)
    with torch.no_grad():
        shape = list(layer(x).shape)
    path = outdir + "/encoder_layer.pt"
    # Traced with gradients on: the general path (linear, bmm, softmax, layer_norm), not the fused
    # inference kernel no_grad would take (which is why the trace check, run without grad, is off).
    torch.jit.trace(layer, x, check_trace=False).save(path)
    result["encoder_layer"] = {"file": path, "parameters": sum(p.numel() for p in layer.parameters()),
                               "output": shape}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
