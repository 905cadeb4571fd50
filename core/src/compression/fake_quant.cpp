// Fake quantization for quantization-aware training (fake_quant.h).
#include "compression/fake_quant.h"

namespace lathe::core::compression {

torch::Tensor fakeQuantInput(const torch::Tensor& x, torch::Tensor& absmax, bool training) {
    auto xf = x.to(torch::kFloat);
    if (training) {
        torch::NoGradGuard noGrad;
        const auto now = xf.detach().abs().max();
        // No host sync: the first batch (absmax still 0) starts the average.
        absmax.copy_(torch::where(absmax > 0, absmax * (1.0 - kQatMomentum) + now * kQatMomentum, now));
    }
    const auto scale = (absmax.detach().clamp_min(1e-12) / 127.0).to(torch::kFloat).reshape({1});
    const auto zero = torch::zeros({1}, torch::TensorOptions().dtype(torch::kInt).device(x.device()));
    return at::fake_quantize_per_tensor_affine(xf, scale, zero, -127, 127).to(x.scalar_type());
}

torch::Tensor fakeQuantWeight(const torch::Tensor& w) {
    const auto wf = w.to(torch::kFloat);
    torch::Tensor scale;
    {
        torch::NoGradGuard noGrad;
        scale = (wf.detach().abs().flatten(1).amax(1).clamp_min(1e-12) / 127.0).contiguous();
    }
    const auto zero = torch::zeros({w.size(0)}, torch::TensorOptions().dtype(torch::kInt).device(w.device()));
    return at::fake_quantize_per_channel_affine(wf, scale, zero, 0, -127, 127).to(w.scalar_type());
}

QatLinearImpl::QatLinearImpl(const torch::nn::LinearOptions& options) : torch::nn::LinearImpl(options) {
    actAbsmax = register_buffer("act_absmax", torch::zeros({}));
}

torch::Tensor QatLinearImpl::forward(const torch::Tensor& x) {
    return torch::nn::functional::linear(fakeQuantInput(x, actAbsmax, is_training()), fakeQuantWeight(weight),
                                         bias);
}

QatConv2dImpl::QatConv2dImpl(const torch::nn::Conv2dOptions& options) : torch::nn::Conv2dImpl(options) {
    actAbsmax = register_buffer("act_absmax", torch::zeros({}));
}

torch::Tensor QatConv2dImpl::forward(const torch::Tensor& x) {
    return _conv_forward(fakeQuantInput(x, actAbsmax, is_training()), fakeQuantWeight(weight));
}

std::vector<float> qatInputScales(torch::nn::Sequential& model) {
    std::vector<float> out;
    for (const auto& layer : *model) {
        const auto* p = layer.ptr().get();
        if (const auto* l = dynamic_cast<const QatLinearImpl*>(p))
            out.push_back(l->actAbsmax.item<float>() / 127.f);
        else if (const auto* c = dynamic_cast<const QatConv2dImpl*>(p))
            out.push_back(c->actAbsmax.item<float>() / 127.f);
    }
    return out;
}

}  // namespace lathe::core::compression
