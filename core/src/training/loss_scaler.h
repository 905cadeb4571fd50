#pragma once
// The loss scaler of mixed-precision training (private to training/, LibTorch types). Its rule
// is GradScaler's, checked step by step in tests/core/test_loss_scaler.cpp.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "lathe/core/run_spec.h"
#include "lathe/kernels/optim.h"
#include "lathe/kernels/scale_and_check.h"
#include "training/checkpoint_io.h"
#include "training/fused_optim.h"

namespace lathe::core {

// Dynamic loss scaling with the semantics of torch.cuda.amp.GradScaler: the loss is scaled
// before backward, gradients are unscaled once (checking for inf/NaN) before clipping and the
// optimizer step; a step with non-finite gradients is skipped and the scale backs off; after
// `growth_interval` clean steps in a row it grows. On CUDA the fused ATen ops do the unscale,
// check and update; elsewhere our own fused kernel (kernels/scale_and_check) does the unscale
// and check, and the update rule runs here.
// Does this LibTorch have CPU kernels for the fused AMP ops? 1.13 has them for CUDA only;
// later releases add CPU ones. Probed once on a one-element tensor.
inline bool atenAmpOpsOnCpu() {
    static const bool available = [] {
        try {
            std::vector<torch::Tensor> grads{torch::ones({1})};
            auto found = torch::zeros({1});
            auto inv = torch::ones({1});
            at::_amp_foreach_non_finite_check_and_unscale_(grads, found, inv);
            auto scale = torch::ones({1});
            auto tracker = torch::zeros({1}, torch::kInt);
            at::_amp_update_scale_(scale, tracker, found, 2.0, 0.5, 10);
            return true;
        } catch (const c10::Error&) {
            return false;
        }
    }();
    return available;
}

class LossScaler {
public:
    LossScaler(const RunSpec& spec, torch::Device device) : m_device(device) {
        const auto mode = lossScaleMode(spec);
        m_enabled = mode.kind != LossScaleMode::Kind::Off;
        // Probed only where scaling is on: the probe throws on 1.13 (CPU has no kernel), and a
        // throw costs milliseconds with LibTorch's hundreds of libraries to search for unwind
        // tables, in every short run (a study's trials) that never scales a loss.
        m_useAten = device.is_cuda() || (m_enabled && atenAmpOpsOnCpu());
        m_dynamic = mode.kind == LossScaleMode::Kind::Dynamic;
        m_scale = static_cast<float>(m_dynamic ? spec.lossScaleInit : mode.staticScale);
        m_growth = static_cast<float>(spec.lossScaleGrowth);
        m_backoff = static_cast<float>(spec.lossScaleBackoff);
        m_interval = spec.lossScaleGrowthInterval;
    }
    bool enabled() const { return m_enabled; }
    double scale() const { return m_scale; }
    /// Which implementation unscales and updates: ATen's fused ops or our kernel.
    const char* implementation() const {
        return m_device.is_cpu() ? "Lathe's fused gradient pass"
               : m_useAten       ? "ATen fused AMP ops"
                                 : "Lathe's scale_and_check kernel";
    }

    torch::Tensor scaleLoss(const torch::Tensor& loss) const { return m_enabled ? loss * m_scale : loss; }

    /// Unscales every gradient in place; true when any is inf or NaN.
    bool unscaleAndCheck(const std::vector<torch::Tensor>& params) {
        if (!m_enabled) return false;
        // As GradScaler: the reciprocal is taken in double, then rounded to float.
        const float inv = static_cast<float>(1.0 / static_cast<double>(m_scale));
        std::vector<torch::Tensor> grads;
        for (const auto& p : params)
            if (p.grad().defined()) grads.push_back(p.grad());
        if (m_useAten) {
            auto found = torch::zeros({1}, torch::TensorOptions().dtype(torch::kFloat).device(m_device));
            auto invT = torch::full({1}, inv, torch::TensorOptions().dtype(torch::kFloat).device(m_device));
            at::_amp_foreach_non_finite_check_and_unscale_(grads, found, invT);
            m_foundDevice = found;
            return found.item<float>() != 0.0f;
        }
        bool found = false;
        for (auto& g : grads) {
            TORCH_CHECK(g.scalar_type() == torch::kFloat && g.is_contiguous(),
                        "gradients must be contiguous float32");
            found |= kernels::scaleAndCheck(g.data_ptr<float>(), static_cast<size_t>(g.numel()), inv);
        }
        return found;
    }

    /// What one pass over the gradients found (gradientPass()).
    struct GradSummary {
        bool nonFinite = false;
        double sumSquares = 0;         // of the gradients not flagged sharded
        double shardedSumSquares = 0;  // of those flagged (tensor-parallel shards)
    };

    /// The CPU gradient pass before the optimizer: each fp32 gradient is read once (and, when
    /// the scaler is on, written once) by kernels::gradStats, which unscales it, checks it for
    /// inf/NaN and adds up its squares. `sharded[i]` (when given) puts parameter i's squares in
    /// shardedSumSquares. False, with nothing changed, when a gradient is not a contiguous fp32
    /// CPU tensor: the caller then uses unscaleAndCheck and its own norm.
    bool gradientPass(const std::vector<torch::Tensor>& params, const std::vector<bool>& sharded,
                      GradSummary& out) {
        for (const auto& p : params)
            if (p.grad().defined() && !fusableTensor(p.grad())) return false;
        // As GradScaler: the reciprocal is taken in double, then rounded to float.
        const float inv = m_enabled ? static_cast<float>(1.0 / static_cast<double>(m_scale)) : 1.0f;
        // Pieces of at most kPiece elements, spread over LibTorch's intra-op threads when there
        // are several; their sums are added in piece order, so the result does not depend on
        // the number of threads.
        constexpr int64_t kPiece = int64_t{1} << 16;
        struct Piece {
            size_t param;
            float* g;
            int64_t n;
            kernels::GradStats st;
        };
        std::vector<Piece> pieces;
        for (size_t i = 0; i < params.size(); ++i) {
            const auto& g = params[i].grad();
            if (!g.defined()) continue;
            float* data = g.data_ptr<float>();
            for (int64_t off = 0; off < g.numel(); off += kPiece)
                pieces.push_back({i, data + off, std::min(kPiece, g.numel() - off), {}});
        }
        const auto run = [&](int64_t begin, int64_t end) {
            for (int64_t k = begin; k < end; ++k)
                pieces[k].st = kernels::gradStats(pieces[k].g, static_cast<size_t>(pieces[k].n), inv);
        };
        if (pieces.size() > 1)
            at::parallel_for(0, static_cast<int64_t>(pieces.size()), 1, run);
        else
            run(0, static_cast<int64_t>(pieces.size()));
        out = {};
        for (const auto& pc : pieces) {
            out.nonFinite |= pc.st.nonFinite;
            (pc.param < sharded.size() && sharded[pc.param] ? out.shardedSumSquares : out.sumSquares) +=
                pc.st.sumSquares;
        }
        m_foundDevice.reset();  // the update rule below decides from the flag it is given
        return true;
    }

    void update(bool foundInf) {
        if (!m_dynamic) return;
        if (m_useAten && m_foundDevice.defined()) {
            if (foundInf) m_foundDevice.fill_(1.0f);  // also a non-finite loss, not only gradients
            auto scaleT =
                torch::full({1}, m_scale, torch::TensorOptions().dtype(torch::kFloat).device(m_device));
            auto tracker =
                torch::full({1}, m_tracker, torch::TensorOptions().dtype(torch::kInt).device(m_device));
            at::_amp_update_scale_(scaleT, tracker, m_foundDevice, m_growth, m_backoff, m_interval);
            m_scale = scaleT.item<float>();
            m_tracker = tracker.item<int>();
            return;
        }
        if (foundInf) {
            m_scale *= m_backoff;
            m_tracker = 0;
        } else if (++m_tracker >= m_interval) {
            const float grown = m_scale * m_growth;
            if (std::isfinite(grown)) m_scale = grown;
            m_tracker = 0;
        }
    }

    bool isStatic() const { return m_enabled && !m_dynamic; }

    CheckpointExtras state() const {
        return {{"amp_scale", torch::tensor({m_scale})},
                {"amp_growth_tracker", torch::tensor({m_tracker})},
                {"amp_dynamic", torch::tensor({static_cast<int64_t>(m_dynamic)})}};
    }
    /// Only a dynamic scaler's state carries over, and only into a dynamic scaler: a scale of
    /// 1.0 saved by an unscaled fp32 run must not become an fp16 run's starting scale.
    void restore(const CheckpointExtras& extras) {
        auto dyn = extras.find("amp_dynamic");
        if (!m_dynamic || dyn == extras.end() || dyn->second.item<int64_t>() == 0) return;
        if (auto it = extras.find("amp_scale"); it != extras.end()) m_scale = it->second.item<float>();
        if (auto it = extras.find("amp_growth_tracker"); it != extras.end())
            m_tracker = std::clamp<int64_t>(it->second.item<int64_t>(), 0, m_interval - 1);
    }

private:
    torch::Device m_device;
    bool m_useAten = false;
    bool m_enabled = false, m_dynamic = false;
    float m_scale = 1.0f, m_growth = 2.0f, m_backoff = 0.5f;
    int64_t m_interval = 2000;
    int64_t m_tracker = 0;
    torch::Tensor m_foundDevice;
};

}  // namespace lathe::core
