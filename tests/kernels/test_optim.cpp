// Fused optimizer steps and the gradient pass (optim.h): every SIMD path against the scalar
// reference bit for bit (parameters, gradients, state, the flag and the sum), over lengths that
// straddle each vector width, unaligned starts and guard bands; the reference against values
// computed here in double; the CUDA steps against the reference where a GPU exists. Agreement
// with LibTorch's torch::optim is tests/core/test_fused_optim.cpp.

#include <catch2/catch.hpp>

#include "isa_test_cases.h"
#include "lathe/kernels/cuda_device.h"
#include "lathe/kernels/optim.h"
#include "skip.h"
#include "test_inputs.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>

using namespace lathe::kernels;
using namespace lathe::kernels::test;

namespace {

constexpr std::size_t kGuard = 16;
constexpr std::uint32_t kSentinel = 0x7fbadbadu;

// Four guarded buffers (param, grad, state0, state1) per tensor, starting `offset` floats in.
struct Buffers {
    std::vector<std::vector<float>> store;
    std::vector<OptimTensor> tensors;
    std::vector<std::size_t> offsets, lengths;

    Buffers(const std::vector<std::size_t>& ns, std::size_t offset, std::mt19937& rng, InputKind gradKind) {
        std::normal_distribution<float> normal(0.f, 1.f);
        std::uniform_real_distribution<float> positive(0.f, 2.f);
        for (std::size_t n : ns) {
            OptimTensor t;
            t.n = n;
            const auto grads = makeInput(gradKind, n, rng);
            for (int s = 0; s < 4; ++s) {
                store.emplace_back(kGuard + offset + n + kGuard, fromBits(kSentinel));
                auto& b = store.back();
                for (std::size_t i = 0; i < n; ++i)
                    b[kGuard + offset + i] = s == 1   ? grads[i]
                                             : s == 3 ? positive(rng) * positive(rng)
                                                      : normal(rng);
            }
            tensors.push_back(t);
            offsets.push_back(offset);
            lengths.push_back(n);
        }
        bind();
    }
    Buffers(const Buffers& o) : store(o.store), tensors(o.tensors), offsets(o.offsets), lengths(o.lengths) {
        bind();
    }
    void bind() {
        for (std::size_t k = 0; k < tensors.size(); ++k) {
            float** slots[4] = {&tensors[k].param, &tensors[k].grad, &tensors[k].state0, &tensors[k].state1};
            for (int s = 0; s < 4; ++s) *slots[s] = store[4 * k + s].data() + kGuard + offsets[k];
        }
    }
    bool guardsIntact() const {
        for (std::size_t k = 0; k < tensors.size(); ++k)
            for (int s = 0; s < 4; ++s) {
                const auto& b = store[4 * k + s];
                for (std::size_t i = 0; i < b.size(); ++i) {
                    const bool inside = i >= kGuard + offsets[k] && i < kGuard + offsets[k] + lengths[k];
                    if (!inside && bitsOf(b[i]) != kSentinel) return false;
                }
            }
        return true;
    }
};

// Bitwise equality of every buffer; the first difference described.
std::string firstDifference(const Buffers& a, const Buffers& b) {
    static const char* names[4] = {"param", "grad", "state0", "state1"};
    for (std::size_t k = 0; k < a.tensors.size(); ++k)
        for (int s = 0; s < 4; ++s)
            for (std::size_t i = 0; i < a.store[4 * k + s].size(); ++i)
                if (bitsOf(a.store[4 * k + s][i]) != bitsOf(b.store[4 * k + s][i])) {
                    std::ostringstream os;
                    os << "tensor " << k << " " << names[s] << "[" << (i - kGuard - a.offsets[k])
                       << "]: " << a.store[4 * k + s][i] << " vs " << b.store[4 * k + s][i];
                    return os.str();
                }
    return {};
}

std::vector<AdamHyper> adamVariants() {
    std::vector<AdamHyper> out;
    for (int wd = 0; wd < 2; ++wd)
        for (int decoupled = 0; decoupled < 2; ++decoupled)
            for (int clip = 0; clip < 2; ++clip) {
                AdamHyper h;
                h.beta1 = 0.9f;
                h.oneMinusBeta1 = static_cast<float>(1 - 0.9);
                h.beta2 = 0.999f;
                h.oneMinusBeta2 = static_cast<float>(1 - 0.999);
                h.eps = 1e-8f;
                h.negStepSize = static_cast<float>(-(1e-3 / (1 - std::pow(0.9, 3))));
                h.biasCorrection2Sqrt = static_cast<float>(std::sqrt(1 - std::pow(0.999, 3)));
                h.weightDecay = wd ? 0.01f : 0.f;
                h.decoupledDecay = decoupled ? static_cast<float>(1 - 1e-3 * 0.05) : 1.f;
                h.gradScale = clip ? 0.37f : 1.f;
                out.push_back(h);
            }
    return out;
}

std::vector<SgdHyper> sgdVariants() {
    std::vector<SgdHyper> out;
    for (int wd = 0; wd < 2; ++wd)
        for (int mom = 0; mom < 3; ++mom)  // none, momentum, nesterov
            for (int first = 0; first < 2; ++first)
                for (int clip = 0; clip < 2; ++clip) {
                    SgdHyper h;
                    h.negLr = -0.05f;
                    h.weightDecay = wd ? 1e-4f : 0.f;
                    h.momentum = mom ? 0.9f : 0.f;
                    h.oneMinusDampening = mom == 1 ? 0.75f : 1.f;
                    h.nesterov = mom == 2;
                    h.firstStep = first != 0;
                    h.gradScale = clip ? 0.5f + 1e-3f : 1.f;
                    out.push_back(h);
                }
    return out;
}

const std::vector<std::size_t> kLengths{0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100, 1000, 1025};

template <class Step>
void compareSteps(CpuIsa isa, Step step) {
    std::mt19937 rng(77);
    std::size_t cases = 0;
    for (InputKind kind : {InputKind::Normal, InputKind::HugeRange, InputKind::Denormals, InputKind::OneNaN})
        for (std::size_t offset : {0, 1, 5}) {
            // All lengths as one multi-tensor call, and each length alone.
            const Buffers in(kLengths, offset, rng, kind);
            Buffers ref(in), got(in);
            step(ref, CpuIsa::Scalar);
            step(got, isa);
            INFO(kindName(kind) << " offset " << offset << ": " << firstDifference(ref, got));
            REQUIRE(firstDifference(ref, got).empty());
            REQUIRE(got.guardsIntact());
            ++cases;
        }
    REQUIRE(cases == 12);
}

void checkAdam(CpuIsa isa) {
    for (const AdamHyper& h : adamVariants())
        compareSteps(
            isa, [&](Buffers& b, CpuIsa which) { adamStep(h, b.tensors.data(), b.tensors.size(), which); });
}

void checkSgd(CpuIsa isa) {
    for (const SgdHyper& h : sgdVariants())
        compareSteps(
            isa, [&](Buffers& b, CpuIsa which) { sgdStep(h, b.tensors.data(), b.tensors.size(), which); });
}

void checkGradStats(CpuIsa isa) {
    std::mt19937 rng(99);
    std::size_t cases = 0;
    for (InputKind kind : allKinds())
        for (std::size_t n : allLengths())
            for (float scale :
                 {1.f, 0.5f, 1.f / 65536.f, 3.f, 65536.f, std::numeric_limits<float>::quiet_NaN()})
                for (std::size_t offset : {0, 3}) {
                    const auto in = makeInput(kind, n, rng);
                    std::vector<float> a(in.size() + offset), b(in.size() + offset);
                    std::copy(in.begin(), in.end(), a.begin() + offset);
                    std::copy(in.begin(), in.end(), b.begin() + offset);
                    const GradStats ra = gradStats(a.data() + offset, n, scale, CpuIsa::Scalar);
                    const GradStats rb = gradStats(b.data() + offset, n, scale, isa);
                    INFO(kindName(kind) << " n=" << n << " scale=" << scale << " offset=" << offset);
                    REQUIRE(ra.nonFinite == rb.nonFinite);
                    REQUIRE(ra.nonFinite == expectedFlag(in, scale));
                    if (!ra.nonFinite) {
                        std::uint64_t x, y;
                        std::memcpy(&x, &ra.sumSquares, 8);
                        std::memcpy(&y, &rb.sumSquares, 8);
                        REQUIRE(x == y);
                    }
                    for (std::size_t i = 0; i < a.size(); ++i)
                        if (!(std::isnan(a[i]) && std::isnan(b[i]))) REQUIRE(bitsOf(a[i]) == bitsOf(b[i]));
                    ++cases;
                }
    REQUIRE(cases > 1000);
}

}  // namespace

LATHE_SIMD_TEST_CASES("adam and adamw steps equal the scalar reference bit for bit", "[optim]", checkAdam)
LATHE_SIMD_TEST_CASES("sgd steps equal the scalar reference bit for bit", "[optim]", checkSgd)
LATHE_SIMD_TEST_CASES("the gradient pass equals the scalar reference bit for bit", "[optim]", checkGradStats)

TEST_CASE("the scalar adam step computes Adam", "[optim]") {
    // One element, against the update written out in double and rounded once per operation
    // the way the kernel documents; and the unscaled case against plain double arithmetic.
    const double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8;
    const int step = 1;
    float p = 0.5f, g = -0.25f, m = 0.f, v = 0.f;
    AdamHyper h;
    h.beta1 = static_cast<float>(b1);
    h.oneMinusBeta1 = static_cast<float>(1 - b1);
    h.beta2 = static_cast<float>(b2);
    h.oneMinusBeta2 = static_cast<float>(1 - b2);
    h.eps = static_cast<float>(eps);
    h.negStepSize = static_cast<float>(-(lr / (1 - std::pow(b1, step))));
    h.biasCorrection2Sqrt = static_cast<float>(std::sqrt(1 - std::pow(b2, step)));
    OptimTensor t;
    t.param = &p;
    t.grad = &g;
    t.state0 = &m;
    t.state1 = &v;
    t.n = 1;
    adamStep(h, &t, 1, CpuIsa::Scalar);
    // First Adam step: m̂ = g, v̂ = g², so p moves by lr·g/(|g| + eps) = -lr·sign(g).
    CHECK(p == Approx(0.5 + lr).epsilon(1e-6));
    CHECK(m == Approx(0.1 * -0.25).epsilon(1e-6));
    CHECK(v == Approx(0.001 * 0.0625).epsilon(1e-6));
    CHECK(g == -0.25f);  // gradient untouched without a clip coefficient
}

TEST_CASE("the scalar sgd step computes SGD with momentum", "[optim]") {
    float p[2] = {1.f, -2.f}, g[2] = {0.5f, 0.25f}, buf[2] = {0.f, 0.f};
    OptimTensor t;
    t.param = p;
    t.grad = g;
    t.state0 = buf;
    t.n = 2;
    SgdHyper h;
    h.negLr = -0.1f;
    h.momentum = 0.9f;
    h.firstStep = true;
    sgdStep(h, &t, 1, CpuIsa::Scalar);
    CHECK(buf[0] == 0.5f);
    CHECK(p[0] == Approx(1 - 0.05));
    h.firstStep = false;
    sgdStep(h, &t, 1, CpuIsa::Scalar);
    CHECK(buf[0] == Approx(0.9 * 0.5 + 0.5));
    CHECK(p[0] == Approx(0.95 - 0.1 * 0.95));
    CHECK(p[1] == Approx(-2 - 0.025 - 0.1 * (0.9 * 0.25 + 0.25)));
}

TEST_CASE("the gradient pass adds up exact squares and finds non-finite values", "[optim]") {
    std::vector<float> g{3.f, -4.f, 0.f, 12.f};
    GradStats s = gradStats(g.data(), g.size(), 1.f);
    CHECK(s.sumSquares == 169.0);
    CHECK_FALSE(s.nonFinite);
    CHECK(g[0] == 3.f);
    s = gradStats(g.data(), g.size(), 0.5f);
    CHECK(s.sumSquares == 169.0 / 4);
    CHECK(g[1] == -2.f);
    // Finite values that overflow when unscaled are flagged, as scaleAndCheck flags them.
    std::vector<float> big{std::numeric_limits<float>::max(), 1.f};
    CHECK(gradStats(big.data(), big.size(), 4.f).nonFinite);
    std::vector<float> nan{1.f, std::numeric_limits<float>::quiet_NaN()};
    CHECK(gradStats(nan.data(), nan.size(), 1.f).nonFinite);
    // A long buffer: the double sum is exact for small integers, in any order.
    std::vector<float> ones(100003, 1.f);
    CHECK(gradStats(ones.data(), ones.size(), 1.f).sumSquares == 100003.0);
}

TEST_CASE("cuda optimizer steps equal the CPU reference", "[optim][cuda]") {
    if (!cudaCompiled()) LATHE_SKIP("lathe_kernels built without CUDA");
    if (cuda::deviceCount() == 0) LATHE_SKIP("no CUDA device");
    std::mt19937 rng(5);
    const std::vector<std::size_t> lengths{1, 255, 256, 257, 100000};
    for (const AdamHyper& h : adamVariants()) {
        const Buffers in(lengths, 0, rng, InputKind::Normal);
        Buffers ref(in), got(in);
        adamStep(h, ref.tensors.data(), ref.tensors.size(), CpuIsa::Scalar);
        std::vector<cuda::DeviceBuffer> dev;
        std::vector<OptimTensor> dt;
        for (const auto& t : in.tensors) {
            OptimTensor d;
            d.n = t.n;
            float* host[4] = {t.param, t.grad, t.state0, t.state1};
            float** slot[4] = {&d.param, &d.grad, &d.state0, &d.state1};
            for (int s = 0; s < 4; ++s) {
                dev.emplace_back(t.n * sizeof(float));
                cuda::copyHostToDevice(dev.back().get(), host[s], t.n * sizeof(float));
                *slot[s] = dev.back().as<float>();
            }
            dt.push_back(d);
        }
        cuda::adamStep(h, dt.data(), dt.size());
        cuda::synchronize();
        for (std::size_t k = 0; k < dt.size(); ++k) {
            float* host[4] = {got.tensors[k].param, got.tensors[k].grad, got.tensors[k].state0,
                              got.tensors[k].state1};
            for (int s = 0; s < 4; ++s)
                cuda::copyDeviceToHost(host[s], dev[4 * k + s].get(), dt[k].n * sizeof(float));
        }
        REQUIRE(firstDifference(ref, got).empty());
    }
}
