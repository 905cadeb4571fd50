// CUDA compression kernels against the CPU reference. Needs a GPU; skips with a reason otherwise.
// NaNs compare as "both NaN" (GPUs produce a canonical NaN); everything else bit for bit.

#include <catch2/catch.hpp>

#include "lathe/kernels/compress.h"
#include "lathe/kernels/cuda_device.h"
#include "skip.h"
#include "test_inputs.h"

#include <cmath>
#include <cstring>
#include <random>

using namespace lathe::kernels;
using namespace lathe::kernels::test;

namespace {

std::string whyNoDevice() {
    if (!cudaCompiled()) return "lathe_kernels built without CUDA";
    if (cuda::deviceCount() == 0) return "no CUDA device";
    return {};
}

template <typename T>
cuda::DeviceBuffer upload(const std::vector<T>& v, std::size_t extra = 0) {
    cuda::DeviceBuffer b((v.size() + extra) * sizeof(T) + 16);
    if (!v.empty()) cuda::copyHostToDevice(b.get(), v.data(), v.size() * sizeof(T));
    return b;
}

template <typename T>
std::vector<T> download(const cuda::DeviceBuffer& b, std::size_t n) {
    std::vector<T> v(n);
    if (n) cuda::copyDeviceToHost(v.data(), b.get(), n * sizeof(T));
    return v;
}

void requireSameFloats(const std::vector<float>& got, const std::vector<float>& want) {
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
        if (std::isnan(want[i]) && std::isnan(got[i])) continue;
        if (bitsOf(got[i]) != bitsOf(want[i])) {
            INFO("element " << i << std::hex << " cpu=" << bitsOf(want[i]) << " gpu=" << bitsOf(got[i]));
            REQUIRE(bitsOf(got[i]) == bitsOf(want[i]));
        }
    }
}

}  // namespace

TEST_CASE("CUDA quantize/dequantize match the CPU reference", "[kernels][compress][cuda]") {
    if (const std::string why = whyNoDevice(); !why.empty()) LATHE_SKIP(why);
    std::mt19937 rng(21);
    for (bool int4 : {false, true})
        for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{17}, std::size_t{1000},
                              std::size_t{4099}, std::size_t{1'000'003}})
            for (std::size_t chunk : {std::size_t{1}, std::size_t{16}, std::size_t{100}, std::size_t{4096}})
                for (InputKind kind : allKinds())
                    for (int mode = 0; mode < 4; ++mode) {
                        const std::vector<float> x = makeInput(kind, n, rng);
                        std::vector<float> r = makeInput(InputKind::Normal, n, rng);
                        QuantizeParams p;
                        p.chunk = chunk;
                        p.stochastic = mode & 1;
                        p.seed = 77;
                        p.indexOffset = 5;
                        const bool ef = mode & 2;
                        const std::size_t cb =
                            codeBytes(n, int4 ? CompressFormat::Int4 : CompressFormat::Int8);
                        std::vector<std::uint8_t> codes(cb);
                        std::vector<float> scales(chunkCount(n, chunk));
                        std::vector<float> rc = r;
                        if (int4) {
                            if (ef)
                                quantizeInt4ErrorFeedback(x.data(), rc.data(), n, codes.data(), scales.data(),
                                                          p, CpuIsa::Scalar);
                            else
                                quantizeInt4(x.data(), n, codes.data(), scales.data(), p, CpuIsa::Scalar);
                        } else {
                            auto* c = reinterpret_cast<std::int8_t*>(codes.data());
                            if (ef)
                                quantizeInt8ErrorFeedback(x.data(), rc.data(), n, c, scales.data(), p,
                                                          CpuIsa::Scalar);
                            else
                                quantizeInt8(x.data(), n, c, scales.data(), p, CpuIsa::Scalar);
                        }
                        auto dx = upload(x), dr = upload(r);
                        cuda::DeviceBuffer dc(cb + 16), ds(scales.size() * sizeof(float) + 16);
                        float* rp = ef ? dr.as<float>() : nullptr;
                        if (int4)
                            cuda::quantizeInt4(dx.as<float>(), rp, n, dc.as<std::uint8_t>(), ds.as<float>(),
                                               p);
                        else
                            cuda::quantizeInt8(dx.as<float>(), rp, n, dc.as<std::int8_t>(), ds.as<float>(),
                                               p);
                        cuda::synchronize();
                        INFO((int4 ? "int4" : "int8") << " n=" << n << " chunk=" << chunk << " "
                                                      << kindName(kind) << " mode=" << mode);
                        REQUIRE(download<std::uint8_t>(dc, cb) == codes);
                        requireSameFloats(download<float>(ds, scales.size()), scales);
                        if (ef) requireSameFloats(download<float>(dr, n), rc);
                        for (bool add : {false, true}) {
                            std::vector<float> out = makeInput(InputKind::Normal, n, rng);
                            auto dout = upload(out);
                            if (int4) {
                                if (add)
                                    dequantizeAddInt4(codes.data(), scales.data(), n, chunk, out.data(),
                                                      CpuIsa::Scalar);
                                else
                                    dequantizeInt4(codes.data(), scales.data(), n, chunk, out.data(),
                                                   CpuIsa::Scalar);
                                cuda::dequantizeInt4(dc.as<std::uint8_t>(), ds.as<float>(), n, chunk,
                                                     dout.as<float>(), add);
                            } else {
                                auto* c = reinterpret_cast<const std::int8_t*>(codes.data());
                                if (add)
                                    dequantizeAddInt8(c, scales.data(), n, chunk, out.data(), CpuIsa::Scalar);
                                else
                                    dequantizeInt8(c, scales.data(), n, chunk, out.data(), CpuIsa::Scalar);
                                cuda::dequantizeInt8(dc.as<std::int8_t>(), ds.as<float>(), n, chunk,
                                                     dout.as<float>(), add);
                            }
                            cuda::synchronize();
                            requireSameFloats(download<float>(dout, n), out);
                        }
                    }
}

TEST_CASE("CUDA fp16/bf16 conversions match the CPU reference", "[kernels][compress][cuda]") {
    if (const std::string why = whyNoDevice(); !why.empty()) LATHE_SKIP(why);
    std::mt19937 rng(22);
    std::vector<std::uint16_t> all(65536);
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::uint16_t>(i);
    for (bool bf16 : {false, true}) {
        for (InputKind kind : allKinds())
            for (std::size_t n : {std::size_t{1}, std::size_t{17}, std::size_t{4099}, std::size_t{300'001}}) {
                const std::vector<float> x = makeInput(kind, n, rng);
                std::vector<float> r = makeInput(InputKind::Normal, n, rng), rc = r;
                std::vector<std::uint16_t> o(n);
                if (bf16)
                    floatToBf16ErrorFeedback(x.data(), rc.data(), n, o.data(), CpuIsa::Scalar);
                else
                    floatToHalfErrorFeedback(x.data(), rc.data(), n, o.data(), CpuIsa::Scalar);
                auto dx = upload(x), dr = upload(r);
                cuda::DeviceBuffer dout(n * 2 + 16);
                cuda::floatTo16(dx.as<float>(), dr.as<float>(), n, dout.as<std::uint16_t>(), bf16);
                cuda::synchronize();
                const auto got = download<std::uint16_t>(dout, n);
                INFO((bf16 ? "bf16 " : "fp16 ") << kindName(kind) << " n=" << n);
                for (std::size_t i = 0; i < n; ++i) {
                    const bool nan16 = bf16 ? ((o[i] & 0x7f80) == 0x7f80 && (o[i] & 0x7f))
                                            : ((o[i] & 0x7c00) == 0x7c00 && (o[i] & 0x3ff));
                    if (nan16)
                        REQUIRE(((got[i] & 0x7fff) > (bf16 ? 0x7f80 : 0x7c00)));
                    else if (got[i] != o[i])
                        REQUIRE(got[i] == o[i]);
                }
                requireSameFloats(download<float>(dr, n), rc);
            }
        for (bool add : {false, true}) {
            std::vector<float> out(all.size(), 0.25f);
            auto din = upload(all), dout = upload(out);
            if (bf16 && add)
                addBf16ToFloat(all.data(), all.size(), out.data(), CpuIsa::Scalar);
            else if (bf16)
                bf16ToFloat(all.data(), all.size(), out.data(), CpuIsa::Scalar);
            else if (add)
                addHalfToFloat(all.data(), all.size(), out.data(), CpuIsa::Scalar);
            else
                halfToFloat(all.data(), all.size(), out.data(), CpuIsa::Scalar);
            cuda::floatFrom16(din.as<std::uint16_t>(), all.size(), dout.as<float>(), bf16, add);
            cuda::synchronize();
            requireSameFloats(download<float>(dout, all.size()), out);
        }
    }
}

TEST_CASE("CUDA compression entry points report a missing build clearly", "[kernels][compress][cuda]") {
    if (cudaCompiled()) LATHE_SKIP("lathe_kernels is built with CUDA: there is no missing build to report");
    QuantizeParams p;
    REQUIRE_THROWS_WITH(cuda::quantizeInt8(nullptr, nullptr, 1, nullptr, nullptr, p),
                        Catch::Contains("without CUDA"));
    REQUIRE_THROWS_WITH(cuda::floatTo16(nullptr, nullptr, 1, nullptr, true), Catch::Contains("without CUDA"));
}
