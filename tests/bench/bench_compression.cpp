// bench_compression: gradient-compression kernels against memcpy of the same fp32 buffer,
// measured side by side (alternating, best of several repetitions) for 1, 10 and 100 MB, plus
// wire bytes against fp32. Prints a table and writes bench_compression.json to --out. It
// fails only when something is broken, never because a ratio is low.
//
//   bench_compression [--out DIR] [--reps N]

#include "lathe/kernels/compress.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

using namespace lathe::kernels;

namespace {

double seconds(const std::function<void()>& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Row {
    std::string op;
    double mb;
    double gbps;  // fp32 bytes processed per second
    double memcpyGbps;
    double share;  // op throughput / memcpy throughput
};

}  // namespace

int main(int argc, char** argv) {
    std::string outDir;
    int reps = 9;
    for (int i = 1; i + 1 < argc; ++i) {
        if (!std::strcmp(argv[i], "--out"))
            outDir = argv[++i];
        else if (!std::strcmp(argv[i], "--reps"))
            reps = std::max(1, std::atoi(argv[++i]));
    }
    const std::size_t chunk = kDefaultCompressChunk;
    std::printf("bench_compression: isa=%s chunk=%zu reps=%d (best of)\n", cpuIsaName(bestCpuIsa()), chunk,
                reps);
    std::printf("%-14s %8s %10s %12s %8s\n", "op", "MB", "GB/s", "memcpy GB/s", "share");

    std::vector<Row> rows;
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.f, 1e-3f);
    for (double mb : {1.0, 10.0, 100.0}) {
        const std::size_t n = static_cast<std::size_t>(mb * 1e6 / 4);
        std::vector<float> x(n), y(n), r(n, 0.f);
        for (float& v : x) v = nd(rng);
        std::vector<std::int8_t> c8(n);
        std::vector<std::uint8_t> c4(codeBytes(n, CompressFormat::Int4));
        std::vector<std::uint16_t> h(n);
        std::vector<float> scales(chunkCount(n, chunk));
        QuantizeParams p;
        p.chunk = chunk;
        QuantizeParams ps = p;
        ps.stochastic = true;
        // Touch every output once so page faults are not timed.
        std::memcpy(y.data(), x.data(), n * 4);
        quantizeInt8(x.data(), n, c8.data(), scales.data(), p);
        quantizeInt4(x.data(), n, c4.data(), scales.data(), p);
        floatToHalf(x.data(), n, h.data());

        const std::vector<std::pair<std::string, std::function<void()>>> ops{
            {"q int8", [&] { quantizeInt8(x.data(), n, c8.data(), scales.data(), p); }},
            {"q int8 sr", [&] { quantizeInt8(x.data(), n, c8.data(), scales.data(), ps); }},
            {"q int8 ef",
             [&] { quantizeInt8ErrorFeedback(x.data(), r.data(), n, c8.data(), scales.data(), p); }},
            {"dq int8", [&] { dequantizeInt8(c8.data(), scales.data(), n, chunk, y.data()); }},
            {"dq+ int8", [&] { dequantizeAddInt8(c8.data(), scales.data(), n, chunk, y.data()); }},
            {"q int4", [&] { quantizeInt4(x.data(), n, c4.data(), scales.data(), p); }},
            {"dq int4", [&] { dequantizeInt4(c4.data(), scales.data(), n, chunk, y.data()); }},
            {"to fp16", [&] { floatToHalf(x.data(), n, h.data()); }},
            {"from fp16", [&] { halfToFloat(h.data(), n, y.data()); }},
            {"to bf16", [&] { floatToBf16(x.data(), n, h.data()); }},
            {"from bf16", [&] { bf16ToFloat(h.data(), n, y.data()); }},
        };
        // Scale repetitions so small buffers are timed over a measurable interval.
        const int inner = std::max(1, static_cast<int>(20.0 / mb));
        for (const auto& [name, op] : ops) {
            double bestOp = 1e30, bestCopy = 1e30;
            for (int rep = 0; rep < reps; ++rep) {
                bestCopy = std::min(bestCopy, seconds([&] {
                                        for (int k = 0; k < inner; ++k)
                                            std::memcpy(y.data(), x.data(), n * 4);
                                    }));
                bestOp = std::min(bestOp, seconds([&] {
                                      for (int k = 0; k < inner; ++k) op();
                                  }));
            }
            Row row{name, mb, n * 4.0 * inner / bestOp / 1e9, n * 4.0 * inner / bestCopy / 1e9,
                    bestCopy / bestOp};
            std::printf("%-14s %8.0f %10.2f %12.2f %7.0f%%\n", row.op.c_str(), mb, row.gbps, row.memcpyGbps,
                        100 * row.share);
            rows.push_back(row);
        }
    }

    const std::size_t n = 25'000'000;
    std::printf("\nwire bytes for %zu fp32 values (chunk %zu):\n", n, chunk);
    std::string wire;
    for (CompressFormat f :
         {CompressFormat::Fp16, CompressFormat::Bf16, CompressFormat::Int8, CompressFormat::Int4}) {
        const double ratio = 4.0 * n / compressedBytes(n, chunk, f);
        std::printf("  %-5s %12zu bytes  %.3fx fewer than fp32\n", compressFormatName(f),
                    compressedBytes(n, chunk, f), ratio);
        char buf[160];
        std::snprintf(buf, sizeof buf, "%s\"%s\": {\"bytes\": %zu, \"ratio_vs_fp32\": %.4f}",
                      wire.empty() ? "" : ", ", compressFormatName(f), compressedBytes(n, chunk, f), ratio);
        wire += buf;
    }
    const double r8 = 4.0 * n / compressedBytes(n, chunk, CompressFormat::Int8);
    const double r4 = 4.0 * n / compressedBytes(n, chunk, CompressFormat::Int4);
    std::printf("targets: int8 >= 3.9x: %s, int4 >= 7.5x: %s\n", r8 >= 3.9 ? "met" : "MISSED",
                r4 >= 7.5 ? "met" : "MISSED");
    std::string below;
    std::size_t met = 0;
    for (const Row& row : rows) {
        if (row.share >= 0.5) {
            ++met;
            continue;
        }
        char buf[64];
        std::snprintf(buf, sizeof buf, "%s%s at %.0f MB (%.0f%%)", below.empty() ? "" : ", ", row.op.c_str(),
                      row.mb, 100 * row.share);
        below += buf;
    }
    std::printf("target: >= 50%% of memcpy: met by %zu of %zu ops x sizes%s%s\n", met, rows.size(),
                below.empty() ? "" : "; below: ", below.c_str());

    if (!outDir.empty()) {
        const std::string path = outDir + "/bench_compression.json";
        if (FILE* f = std::fopen(path.c_str(), "w")) {
            std::fprintf(f,
                         "{\n  \"bench\": \"compression\",\n  \"isa\": \"%s\",\n  \"chunk\": %zu,\n  "
                         "\"throughput\": [\n",
                         cpuIsaName(bestCpuIsa()), chunk);
            for (std::size_t i = 0; i < rows.size(); ++i)
                std::fprintf(f,
                             "    {\"op\": \"%s\", \"mb\": %.0f, \"gbps\": %.3f, \"memcpy_gbps\": %.3f, "
                             "\"share_of_memcpy\": %.4f}%s\n",
                             rows[i].op.c_str(), rows[i].mb, rows[i].gbps, rows[i].memcpyGbps, rows[i].share,
                             i + 1 < rows.size() ? "," : "");
            std::fprintf(f, "  ],\n  \"wire\": {%s}\n}\n", wire.c_str());
            std::fclose(f);
            std::printf("wrote %s\n", path.c_str());
        } else {
            std::fprintf(stderr, "cannot write %s\n", path.c_str());
            return 1;
        }
    }
    return 0;
}
