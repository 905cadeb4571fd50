// The element-wise optimizer bodies of optim.cpp, over a vector interface `Vec` (see there).
// No include guard: optim.cpp includes this file once per code path, each time inside its own
// namespace and, for the SIMD paths, inside a `#pragma GCC target` region, so that every
// function here is compiled for that path's instruction set (a target attribute on a template's
// members cannot depend on its parameter). The tail of each tensor uses `Scalar` (declared
// before the includes): the same operations one element at a time, so the same bits.
// NOLINTBEGIN(llvm-header-guard)

// Each handles the elements [i, i + Vec::kWidth) of one tensor.

template <class Vec, bool kDecay, bool kDecoupled, bool kScaleGrad>
struct AdamBody {
    typename Vec::V b1, omb1, b2, omb2, eps, negStep, bc2, wd, decay, gs;
    explicit AdamBody(const AdamHyper& h)
        : b1(Vec::set1(h.beta1)),
          omb1(Vec::set1(h.oneMinusBeta1)),
          b2(Vec::set1(h.beta2)),
          omb2(Vec::set1(h.oneMinusBeta2)),
          eps(Vec::set1(h.eps)),
          negStep(Vec::set1(h.negStepSize)),
          bc2(Vec::set1(h.biasCorrection2Sqrt)),
          wd(Vec::set1(h.weightDecay)),
          decay(Vec::set1(h.decoupledDecay)),
          gs(Vec::set1(h.gradScale)) {}
    void operator()(const OptimTensor& t, std::size_t i) const {
        auto g = Vec::load(t.grad + i);
        auto p = Vec::load(t.param + i);
        if (kScaleGrad) {
            g = Vec::mul(g, gs);
            Vec::store(t.grad + i, g);
        }
        if (kDecoupled) p = Vec::mul(p, decay);  // AdamW: p.mul_(1 - lr·wd)
        if (kDecay) g = Vec::fma(p, wd, g);      // Adam: grad.add(p, wd)
        auto m = Vec::fma(g, omb1, Vec::mul(Vec::load(t.state0 + i), b1));
        // addcmul_(g, g, 1-β2): self + (value·t1)·t2 with the last multiply fused into the add,
        // as LibTorch 1.13's CPU kernel computes it (tests/core/test_fused_optim.cpp).
        auto v = Vec::fma(Vec::mul(omb2, g), g, Vec::mul(Vec::load(t.state1 + i), b2));
        Vec::store(t.state0 + i, m);
        Vec::store(t.state1 + i, v);
        const auto denom = Vec::add(Vec::div(Vec::sqrt(v), bc2), eps);
        // addcdiv_(m, denom, -step): self + (value·t1)/t2.
        Vec::store(t.param + i, Vec::add(p, Vec::div(Vec::mul(negStep, m), denom)));
    }
};

template <class Vec, bool kDecay, bool kMomentum, bool kScaleGrad>
struct SgdBody {
    typename Vec::V negLr, wd, mu, omd, gs;
    bool nesterov, first;
    explicit SgdBody(const SgdHyper& h)
        : negLr(Vec::set1(h.negLr)),
          wd(Vec::set1(h.weightDecay)),
          mu(Vec::set1(h.momentum)),
          omd(Vec::set1(h.oneMinusDampening)),
          gs(Vec::set1(h.gradScale)),
          nesterov(h.nesterov),
          first(h.firstStep) {}
    void operator()(const OptimTensor& t, std::size_t i) const {
        auto d = Vec::load(t.grad + i);
        const auto p = Vec::load(t.param + i);
        if (kScaleGrad) {
            d = Vec::mul(d, gs);
            Vec::store(t.grad + i, d);
        }
        if (kDecay) d = Vec::fma(p, wd, d);  // d_p.add(p, wd)
        if (kMomentum) {
            const auto buf = first ? d : Vec::fma(d, omd, Vec::mul(Vec::load(t.state0 + i), mu));
            Vec::store(t.state0 + i, buf);
            d = nesterov ? Vec::fma(buf, mu, d) : buf;
        }
        Vec::store(t.param + i, Vec::fma(d, negLr, p));  // p.add_(d_p, -lr)
    }
};

// Runs `body` over every tensor: whole vectors, then the tail element by element with the
// scalar body (the same operations, so the same bits).
template <class Body, class ScalarBody>
inline void forEachElement(const Body& body, const ScalarBody& tail, const OptimTensor* tensors,
                           std::size_t count, std::size_t width) {
    for (std::size_t k = 0; k < count; ++k) {
        const OptimTensor& t = tensors[k];
        std::size_t i = 0;
        for (; i + width <= t.n; i += width) body(t, i);
        for (; i < t.n; ++i) tail(t, i);
    }
}

template <class Vec, bool D, bool W, bool S>
inline void adamRun(const AdamHyper& h, const OptimTensor* t, std::size_t count) {
    forEachElement(AdamBody<Vec, D, W, S>(h), AdamBody<Scalar, D, W, S>(h), t, count, Vec::kWidth);
}

template <class Vec>
inline void adamDispatch(const AdamHyper& h, const OptimTensor* t, std::size_t count) {
    const bool d = h.weightDecay != 0, w = h.decoupledDecay != 1, s = h.gradScale != 1;
    if (s) {
        if (d && w) return adamRun<Vec, true, true, true>(h, t, count);
        if (d) return adamRun<Vec, true, false, true>(h, t, count);
        if (w) return adamRun<Vec, false, true, true>(h, t, count);
        return adamRun<Vec, false, false, true>(h, t, count);
    }
    if (d && w) return adamRun<Vec, true, true, false>(h, t, count);
    if (d) return adamRun<Vec, true, false, false>(h, t, count);
    if (w) return adamRun<Vec, false, true, false>(h, t, count);
    return adamRun<Vec, false, false, false>(h, t, count);
}

template <class Vec, bool D, bool M, bool S>
inline void sgdRun(const SgdHyper& h, const OptimTensor* t, std::size_t count) {
    forEachElement(SgdBody<Vec, D, M, S>(h), SgdBody<Scalar, D, M, S>(h), t, count, Vec::kWidth);
}

template <class Vec>
inline void sgdDispatch(const SgdHyper& h, const OptimTensor* t, std::size_t count) {
    const bool d = h.weightDecay != 0, m = h.momentum != 0, s = h.gradScale != 1;
    if (s) {
        if (d && m) return sgdRun<Vec, true, true, true>(h, t, count);
        if (d) return sgdRun<Vec, true, false, true>(h, t, count);
        if (m) return sgdRun<Vec, false, true, true>(h, t, count);
        return sgdRun<Vec, false, false, true>(h, t, count);
    }
    if (d && m) return sgdRun<Vec, true, true, false>(h, t, count);
    if (d) return sgdRun<Vec, true, false, false>(h, t, count);
    if (m) return sgdRun<Vec, false, true, false>(h, t, count);
    return sgdRun<Vec, false, false, false>(h, t, count);
}

// NOLINTEND(llvm-header-guard)
