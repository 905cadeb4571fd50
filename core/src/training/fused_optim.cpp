// torch::optim's SGD, Adam and AdamW on the fused kernels (fused_optim.h).
#include "training/fused_optim.h"

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>

#include "lathe/kernels/optim.h"

namespace lathe::core {

namespace {

// The optimizer's state map, whatever LibTorch keys it by (optimizerStateKey()).
using StateMap = std::remove_reference_t<decltype(std::declval<torch::optim::Optimizer&>().state())>;

auto stateKey(const torch::Tensor& p) { return optimizerStateKey(p); }

// Hyper-parameters compared field by field (not memcmp: the structs have padding).
bool sameHyper(const kernels::AdamHyper& a, const kernels::AdamHyper& b) {
    return a.beta1 == b.beta1 && a.oneMinusBeta1 == b.oneMinusBeta1 && a.beta2 == b.beta2 &&
           a.oneMinusBeta2 == b.oneMinusBeta2 && a.eps == b.eps && a.negStepSize == b.negStepSize &&
           a.biasCorrection2Sqrt == b.biasCorrection2Sqrt && a.weightDecay == b.weightDecay &&
           a.decoupledDecay == b.decoupledDecay && a.gradScale == b.gradScale;
}
bool sameHyper(const kernels::SgdHyper& a, const kernels::SgdHyper& b) {
    return a.negLr == b.negLr && a.weightDecay == b.weightDecay && a.momentum == b.momentum &&
           a.oneMinusDampening == b.oneMinusDampening && a.nesterov == b.nesterov &&
           a.firstStep == b.firstStep && a.gradScale == b.gradScale;
}

bool fusableParam(const torch::Tensor& p) {
    if (!fusableTensor(p)) return false;
    const auto& g = p.grad();
    return !g.defined() || (fusableTensor(g) && g.numel() == p.numel());
}

float* f32(const torch::Tensor& t) { return t.data_ptr<float>(); }

// Elements per piece when a step is split over LibTorch's intra-op threads: about 2 MB of
// Adam's traffic, well above a thread hand-off's cost. A small network is one piece and runs
// on the calling thread.
constexpr size_t kPieceElements = size_t{1} << 16;

// Runs `step(hyper, tensors, count)` over runs of tensors that share their hyper-parameters (all
// of them, unless step counts differ), so one kernel call covers the whole network; a large one
// is cut into pieces of whole elements (each element's update is independent of the others',
// so the bits do not depend on the cut) spread over at::parallel_for's threads.
template <class Hyper, class Step>
void runBatched(const std::vector<Hyper>& hypers, const std::vector<kernels::OptimTensor>& tensors,
                Step step) {
    size_t total = 0;
    for (const auto& t : tensors) total += t.n;
    if (total <= kPieceElements || at::get_num_threads() <= 1) {
        size_t start = 0;
        for (size_t i = 1; i <= tensors.size(); ++i)
            if (i == tensors.size() || !sameHyper(hypers[i], hypers[start])) {
                step(hypers[start], tensors.data() + start, i - start);
                start = i;
            }
        return;
    }
    std::vector<std::pair<size_t, kernels::OptimTensor>> pieces;  // (hyper index, piece)
    for (size_t i = 0; i < tensors.size(); ++i)
        for (size_t off = 0; off < tensors[i].n; off += kPieceElements) {
            kernels::OptimTensor p = tensors[i];
            const auto shift = [off](float* ptr) { return ptr ? ptr + off : ptr; };
            p.param = shift(p.param);
            p.grad = shift(p.grad);
            p.state0 = shift(p.state0);
            p.state1 = shift(p.state1);
            p.n = std::min(kPieceElements, tensors[i].n - off);
            pieces.emplace_back(i, p);
        }
    at::parallel_for(0, static_cast<int64_t>(pieces.size()), 1, [&](int64_t begin, int64_t end) {
        for (int64_t k = begin; k < end; ++k) step(hypers[pieces[k].first], &pieces[k].second, 1);
    });
}

// Parameters written through their data pointers: their version counters move as an in-place
// op's would, so autograd still notices a stale saved tensor.
void bumpVersions(const std::vector<torch::Tensor>& written) {
    for (const auto& t : written) torch::autograd::impl::bump_version(t);
}

// Adam and AdamW: the same state, AdamW's decay on the parameter instead of the gradient.
template <class Options, class State, bool kDecoupled>
bool adamFamilyStep(std::vector<torch::optim::OptimizerParamGroup>& groups, StateMap& states,
                    double gradScale) {
    // Everything is checked before anything changes: the fallback must find the state untouched.
    // The states found are kept for the second loop (one lookup per parameter and step).
    // The lists are kept from step to step (per thread and optimizer kind): no allocation.
    static thread_local std::vector<State*> found;
    found.clear();
    for (auto& group : groups) {
        const auto& o = static_cast<const Options&>(group.options());
        if (o.amsgrad()) return false;
        for (const auto& p : group.params()) {
            if (!p.grad().defined()) continue;
            if (!fusableParam(p)) return false;
            auto it = states.find(stateKey(p));
            State* s = it == states.end() ? nullptr : static_cast<State*>(it->second.get());
            if (s && (!fusableTensor(s->exp_avg()) || !fusableTensor(s->exp_avg_sq()) ||
                      s->exp_avg().numel() != p.numel() || s->exp_avg_sq().numel() != p.numel()))
                return false;
            found.push_back(s);
        }
    }
    static thread_local std::vector<kernels::AdamHyper> hypers;
    static thread_local std::vector<kernels::OptimTensor> tensors;
    static thread_local std::vector<torch::Tensor> written;
    hypers.clear();
    tensors.clear();
    written.clear();
    size_t next = 0;
    for (auto& group : groups) {
        const auto& o = static_cast<const Options&>(group.options());
        const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
        for (const auto& p : group.params()) {
            if (!p.grad().defined()) continue;
            State* s = found[next++];
            if (!s) {
                auto fresh = std::make_unique<State>();
                fresh->step(0);
                fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
                fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
                s = fresh.get();
                states[stateKey(p)] = std::move(fresh);
            }
            s->step(s->step() + 1);
            // The scalars as LibTorch 1.13 computes them, in double, each rounded to float once
            // where ATen takes it as a Scalar of a float tensor op.
            const double bc1 = 1 - std::pow(beta1, s->step());
            const double bc2 = 1 - std::pow(beta2, s->step());
            kernels::AdamHyper h;
            h.beta1 = static_cast<float>(beta1);
            h.oneMinusBeta1 = static_cast<float>(1 - beta1);
            h.beta2 = static_cast<float>(beta2);
            h.oneMinusBeta2 = static_cast<float>(1 - beta2);
            h.eps = static_cast<float>(o.eps());
            h.negStepSize = static_cast<float>(-(o.lr() / bc1));
            h.biasCorrection2Sqrt = static_cast<float>(std::sqrt(bc2));
            if (o.weight_decay() != 0) {
                if (kDecoupled)
                    h.decoupledDecay = static_cast<float>(1 - o.lr() * o.weight_decay());
                else
                    h.weightDecay = static_cast<float>(o.weight_decay());
            }
            h.gradScale = static_cast<float>(gradScale);
            kernels::OptimTensor t;
            t.param = f32(p);
            t.grad = f32(p.grad());
            t.state0 = f32(s->exp_avg());
            t.state1 = f32(s->exp_avg_sq());
            t.n = static_cast<size_t>(p.numel());
            hypers.push_back(h);
            tensors.push_back(t);
            written.push_back(p);
            if (gradScale != 1.0) written.push_back(p.grad());
        }
    }
    runBatched(hypers, tensors, [](const kernels::AdamHyper& h, const kernels::OptimTensor* t, size_t n) {
        kernels::adamStep(h, t, n);
    });
    bumpVersions(written);
    written.clear();  // no reference kept past the step
    return true;
}

bool sgdStep(std::vector<torch::optim::OptimizerParamGroup>& groups, StateMap& states, double gradScale) {
    using torch::optim::SGDOptions;
    using torch::optim::SGDParamState;
    static thread_local std::vector<SGDParamState*> found;  // as in adamFamilyStep
    found.clear();
    for (auto& group : groups) {
        const auto& o = static_cast<const SGDOptions&>(group.options());
        for (const auto& p : group.params()) {
            if (!p.grad().defined()) continue;
            if (!fusableParam(p)) return false;
            if (o.momentum() == 0) continue;
            auto it = states.find(stateKey(p));
            auto* s = it == states.end() ? nullptr : static_cast<SGDParamState*>(it->second.get());
            if (s && (!fusableTensor(s->momentum_buffer()) || s->momentum_buffer().numel() != p.numel()))
                return false;
            found.push_back(s);
        }
    }
    static thread_local std::vector<kernels::SgdHyper> hypers;
    static thread_local std::vector<kernels::OptimTensor> tensors;
    static thread_local std::vector<torch::Tensor> written;
    hypers.clear();
    tensors.clear();
    written.clear();
    size_t next = 0;
    for (auto& group : groups) {
        const auto& o = static_cast<const SGDOptions&>(group.options());
        for (const auto& p : group.params()) {
            if (!p.grad().defined()) continue;
            kernels::SgdHyper h;
            h.negLr = static_cast<float>(-1 * o.lr());
            h.weightDecay = static_cast<float>(o.weight_decay());
            h.gradScale = static_cast<float>(gradScale);
            kernels::OptimTensor t;
            t.param = f32(p);
            t.grad = f32(p.grad());
            t.n = static_cast<size_t>(p.numel());
            if (o.momentum() != 0) {
                h.momentum = static_cast<float>(o.momentum());
                h.oneMinusDampening = static_cast<float>(1 - o.dampening());
                h.nesterov = o.nesterov();
                SGDParamState* st = found[next++];
                if (!st) {
                    // LibTorch starts the buffer as a copy of the (decayed) gradient: the kernel
                    // writes it whole on this first step.
                    auto fresh = std::make_unique<SGDParamState>();
                    fresh->momentum_buffer(torch::empty_like(p, torch::MemoryFormat::Preserve));
                    t.state0 = f32(fresh->momentum_buffer());
                    h.firstStep = true;
                    states[stateKey(p)] = std::move(fresh);
                } else {
                    t.state0 = f32(st->momentum_buffer());
                }
            }
            hypers.push_back(h);
            tensors.push_back(t);
            written.push_back(p);
            if (gradScale != 1.0) written.push_back(p.grad());
        }
    }
    runBatched(hypers, tensors, [](const kernels::SgdHyper& h, const kernels::OptimTensor* t, size_t n) {
        kernels::sgdStep(h, t, n);
    });
    bumpVersions(written);
    written.clear();  // no reference kept past the step
    return true;
}

}  // namespace

bool fusableTensor(const torch::Tensor& t) {
    return t.defined() && t.device().is_cpu() && t.layout() == torch::kStrided &&
           t.scalar_type() == torch::kFloat && t.is_contiguous() && !t.is_neg() && !t.is_conj();
}

void FusedStep::applyGradScale(const std::vector<torch::optim::OptimizerParamGroup>& groups, double factor) {
    if (factor == 1.0) return;
    torch::NoGradGuard noGrad;
    for (const auto& group : groups)
        for (const auto& p : group.params())
            if (p.grad().defined()) p.grad().mul_(factor);
}

// The fused step where the kernels take every tensor, else LibTorch's (Base's, called
// non-virtually) after the pending gradient factor was applied with ATen.
template <class Base, class Fused>
torch::Tensor FusedStep::run(Base& self, torch::optim::Optimizer::LossClosure closure, Fused fused) {
    const double scale = std::exchange(m_gradScale, 1.0);
    torch::NoGradGuard noGrad;
    m_lastFused = !closure && fused(scale);
    if (m_lastFused) return {};
    applyGradScale(self.param_groups(), scale);
    return self.Base::step(std::move(closure));
}

torch::Tensor FusedSGD::step(LossClosure closure) {
    return run<torch::optim::SGD>(*this, std::move(closure),
                                  [this](double scale) { return sgdStep(param_groups_, state_, scale); });
}

torch::Tensor FusedAdam::step(LossClosure closure) {
    return run<torch::optim::Adam>(*this, std::move(closure), [this](double scale) {
        return adamFamilyStep<torch::optim::AdamOptions, torch::optim::AdamParamState, false>(param_groups_,
                                                                                              state_, scale);
    });
}

torch::Tensor FusedAdamW::step(LossClosure closure) {
    return run<torch::optim::AdamW>(*this, std::move(closure), [this](double scale) {
        return adamFamilyStep<torch::optim::AdamWOptions, torch::optim::AdamWParamState, true>(param_groups_,
                                                                                               state_, scale);
    });
}

}  // namespace lathe::core
