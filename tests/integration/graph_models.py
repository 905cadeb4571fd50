#!/usr/bin/python3
"""Writes TorchScript and ONNX files of models no one here wrote, and what PyTorch (and the onnx
package) say about them, for test_graph.cpp and the Graph view's test: torchvision's ResNet-18
(traced, weights=None) and a TransformerEncoderLayer (traced). Prints one JSON object: per model
its files, parameter count, output shape, op counts and the multiply-adds of its Conv2d and Linear
layers (from forward hooks); for the ONNX files the op types the onnx package counts.

  graph_models.py OUTDIR [--onnx-only]
"""
import collections
import contextlib
import io
import json
import sys
import warnings

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


def export_onnx(model, x, path, dynamic_batch):
    axes = {"input": {0: "batch"}, "output": {0: "batch"}} if dynamic_batch else None
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(model, x, path, input_names=["input"], output_names=["output"],
                          dynamic_axes=axes, opset_version=14, do_constant_folding=False,
                          training=torch.onnx.TrainingMode.PRESERVE)


def onnx_facts(path):
    facts = {"file": path}
    try:
        import onnx
    except ImportError:
        return facts
    model = onnx.load(path)
    facts["op_counts"] = dict(collections.Counter(n.op_type for n in model.graph.node))
    facts["opset"] = max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    return facts


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
    # ONNX in training mode, so batch norms stay BatchNormalization nodes (eval mode folds them
    # into the convolutions), with a symbolic batch dimension.
    onnx_path = outdir + "/resnet18.onnx"
    export_onnx(resnet.train(), x, onnx_path, dynamic_batch=True)
    result["resnet18"]["onnx"] = onnx_facts(onnx_path)
    resnet.eval()

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
    onnx_path = outdir + "/encoder_layer.onnx"
    export_onnx(layer, x, onnx_path, dynamic_batch=False)
    result["encoder_layer"]["onnx"] = onnx_facts(onnx_path)
    # A scripted model calling a custom op (registered here, in Python): a program without the
    # op's library must refuse it clearly.
    lib = torch.library.Library("lathe_test", "DEF")
    lib.define("scale2(Tensor x) -> Tensor")
    lib.impl("scale2", lambda x: x * 2, "CPU")

    class CustomOp(torch.nn.Module):
        def forward(self, x):
            return torch.ops.lathe_test.scale2(torch.relu(x))

    torch.jit.script(CustomOp()).save(outdir + "/custom_op.pt")
    result["custom_op"] = outdir + "/custom_op.pt"
    try:
        import onnx
        # The same model declaring an opset from the future: readers must refuse it clearly.
        model = onnx.load(onnx_path)
        for o in model.opset_import:
            if o.domain in ("", "ai.onnx"):
                o.version = 99
        onnx.save(model, outdir + "/future_opset.onnx")
        result["future_opset"] = outdir + "/future_opset.onnx"
    except ImportError:
        pass
    print(json.dumps(result))


if __name__ == "__main__":
    main()
