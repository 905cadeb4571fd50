// bench_kernels_cuda: the CUDA kernels (loss-scaler unscale-and-check, gradient compression)
// against the device's own copy bandwidth, measured side by side in one process: each kernel's
// bytes read + written per second as a share of cudaMemcpyAsync device-to-device on the same
// buffer size. Memory-bound kernels should come close to a copy; the table says how close.
// Exits 77 (skipped) on a machine without a CUDA device or a build without CUDA.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "bench_args.h"
#include "lathe/kernels/compress.h"
#include "lathe/kernels/cuda_device.h"
#include "lathe/kernels/info.h"
#include "lathe/kernels/scale_and_check.h"

using namespace lathe::kernels;
using Clock = std::chrono::steady_clock;

namespace {

// Median seconds of `reps` timed calls (each synchronised), after warm-up calls.
double medianSeconds(const std::function<void()>& fn, int reps) {
    for (int i = 0; i < 3; ++i) fn();
    cuda::synchronize();
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) {
        const auto s = Clock::now();
        fn();
        cuda::synchronize();
        t.push_back(std::chrono::duration<double>(Clock::now() - s).count());
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    const auto [out, quick] = lathe::test::benchArgs(argc, argv);
    if (!cudaCompiled() || cuda::deviceCount() == 0) {
        std::printf("SKIPPED: %s\n", cudaCompiled() ? "no CUDA device" : "lathe_kernels built without CUDA");
        return 77;
    }
    cuda::setDevice(0);
    std::printf("bench_kernels_cuda: %s; chunk %zu; median of %d synchronised calls\n\n",
                cuda::deviceDescription(0).c_str(), kDefaultCompressChunk, quick ? 5 : 20);
    const int reps = quick ? 5 : 20;
    std::string json = "[";
    std::printf("%-34s %8s %10s %10s %8s\n", "kernel", "MB", "us", "GB/s", "of copy");
    for (const std::size_t mb : {std::size_t{1}, std::size_t{16}, std::size_t{256}}) {
        const std::size_t n = mb * (std::size_t{1} << 20) / sizeof(float);
        const std::size_t chunk = kDefaultCompressChunk;
        const std::size_t chunks = chunkCount(n, chunk);
        cuda::DeviceBuffer x(n * 4), y(n * 4), residual(n * 4), codes8(n),
            codes4(codeBytes(n, CompressFormat::Int4)), half(n * 2), scales(chunks * 4), flag(4);
        std::vector<float> host(n);
        for (std::size_t i = 0; i < n; ++i)
            host[i] = static_cast<float>((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
        cuda::copyHostToDevice(x.get(), host.data(), n * 4);
        cuda::deviceMemset(residual.get(), 0, n * 4);
        cuda::deviceMemset(flag.get(), 0, 4);

        // The baseline: a device-to-device copy of the fp32 buffer (n*4 read + n*4 written).
        const double copyS = medianSeconds([&] { cuda::copyDeviceToDevice(y.get(), x.get(), n * 4); }, reps);
        const double copyGBs = 2.0 * n * 4 / copyS / 1e9;
        struct Case {
            const char* name;
            double bytes;  // read + written
            std::function<void()> fn;
        };
        QuantizeParams qp;
        qp.chunk = chunk;
        QuantizeParams sr = qp;
        sr.stochastic = true;
        sr.seed = 7;
        const double sc = static_cast<double>(chunks) * 4;
        const std::vector<Case> cases{
            {"device copy (baseline)", 8.0 * n, [&] { cuda::copyDeviceToDevice(y.get(), x.get(), n * 4); }},
            {"scaleAndCheck (unscale, in place)", 8.0 * n,
             [&] { cuda::scaleAndCheck(y.as<float>(), n, 0.5f, flag.as<int>()); }},
            {"quantizeInt8", 5.0 * n + sc,
             [&] {
                 cuda::quantizeInt8(x.as<float>(), nullptr, n, codes8.as<std::int8_t>(), scales.as<float>(),
                                    qp);
             }},
            {"quantizeInt8 stochastic + EF", 13.0 * n + sc,
             [&] {
                 cuda::quantizeInt8(x.as<float>(), residual.as<float>(), n, codes8.as<std::int8_t>(),
                                    scales.as<float>(), sr);
             }},
            {"dequantizeInt8 accumulate", 9.0 * n + sc,
             [&] {
                 cuda::dequantizeInt8(codes8.as<std::int8_t>(), scales.as<float>(), n, chunk, y.as<float>(),
                                      true);
             }},
            {"quantizeInt4", 4.5 * n + sc,
             [&] {
                 cuda::quantizeInt4(x.as<float>(), nullptr, n, codes4.as<std::uint8_t>(), scales.as<float>(),
                                    qp);
             }},
            {"dequantizeInt4", 4.5 * n + sc,
             [&] {
                 cuda::dequantizeInt4(codes4.as<std::uint8_t>(), scales.as<float>(), n, chunk, y.as<float>(),
                                      false);
             }},
            {"floatTo16 (fp16)", 6.0 * n,
             [&] { cuda::floatTo16(x.as<float>(), nullptr, n, half.as<std::uint16_t>(), false); }},
            {"floatTo16 (bf16) + EF", 14.0 * n,
             [&] {
                 cuda::floatTo16(x.as<float>(), residual.as<float>(), n, half.as<std::uint16_t>(), true);
             }},
            {"floatFrom16 (fp16) accumulate", 10.0 * n,
             [&] { cuda::floatFrom16(half.as<std::uint16_t>(), n, y.as<float>(), false, true); }},
        };
        for (const auto& c : cases) {
            const double s = c.fn ? medianSeconds(c.fn, reps) : copyS;
            const double gbs = c.bytes / s / 1e9;
            std::printf("%-34s %8zu %10.1f %10.1f %7.0f%%\n", c.name, mb, s * 1e6, gbs, 100 * gbs / copyGBs);
            char buf[256];
            std::snprintf(
                buf, sizeof buf,
                "%s{\"kernel\":\"%s\",\"mb\":%zu,\"us\":%.2f,\"gb_per_s\":%.2f,\"share_of_copy\":%.4f}",
                json.size() > 1 ? "," : "", c.name, mb, s * 1e6, gbs, gbs / copyGBs);
            json += buf;
        }
        std::printf("\n");
    }
    json += "]\n";
    if (!out.empty()) std::ofstream(out + "/bench_kernels_cuda.json") << json;
    return 0;
}
