// bench_compression: gradient-compression kernels against memcpy of the same fp32 buffer,
// measured side by side (alternating, best of several repetitions) for 1, 10 and 100 MB of fp32
// input. Each op's effective bandwidth counts the bytes it actually reads plus the bytes it
// writes (its inputs and outputs: codes, scales, residuals), and is compared with memcpy's,
// which reads and writes the fp32 buffer once each. (Normalising every op by the fp32 size
// instead would credit an op that writes a quarter of the bytes with bandwidth it never used.)
// It also prints the wire size of each format by the size formula: arithmetic, not a
// measurement; bench_allreduce measures the bytes an exchange writes to its sockets.
// Prints a table and writes bench_compression.json to --out. It fails only when something is
// broken, never because a ratio is low.
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
    double mb;                               // fp32 input size
    double bytesRead = 0, bytesWritten = 0;  // per call
    double gbps = 0;                         // (bytes read + bytes written) per second
    double memcpyGbps = 0;                   // memcpy of the fp32 buffer: 4n read + 4n written, per second
    double share = 0;                        // gbps / memcpyGbps
    double timeRatio = 0;  // memcpy time / op time (context: ignores how many bytes the op moves)
};

struct Op {
    std::string name;
    double read, written;  // bytes per call: inputs read, outputs written
    std::function<void()> run;
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
    std::printf("effective bandwidth = (bytes read + bytes written) / time; memcpy: 4n read + 4n written\n");
    std::printf("%-12s %7s %9s %10s %12s %7s %10s\n", "op", "fp32 MB", "r+w MB", "GB/s r+w", "memcpy GB/s",
                "share", "t(cp)/t(op)");

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

        // Bytes each op reads and writes per call: fp32 values 4 bytes, int8 codes 1, int4
        // codes codeBytes(n, Int4), fp16/bf16 2, one 4-byte scale per chunk.
        const double f32 = 4.0 * n, i8 = n, i4 = static_cast<double>(c4.size()), h16 = 2.0 * n,
                     sc = 4.0 * scales.size();
        const std::vector<Op> ops{
            {"q int8", f32, i8 + sc, [&] { quantizeInt8(x.data(), n, c8.data(), scales.data(), p); }},
            {"q int8 sr", f32, i8 + sc, [&] { quantizeInt8(x.data(), n, c8.data(), scales.data(), ps); }},
            // Reads gradient and residual, writes codes, scales and the residual back.
            {"q int8 ef", 2 * f32, i8 + sc + f32,
             [&] { quantizeInt8ErrorFeedback(x.data(), r.data(), n, c8.data(), scales.data(), p); }},
            {"dq int8", i8 + sc, f32, [&] { dequantizeInt8(c8.data(), scales.data(), n, chunk, y.data()); }},
            // Reads codes, scales and the sum it adds to; writes the sum.
            {"dq+ int8", i8 + sc + f32, f32,
             [&] { dequantizeAddInt8(c8.data(), scales.data(), n, chunk, y.data()); }},
            {"q int4", f32, i4 + sc, [&] { quantizeInt4(x.data(), n, c4.data(), scales.data(), p); }},
            {"dq int4", i4 + sc, f32, [&] { dequantizeInt4(c4.data(), scales.data(), n, chunk, y.data()); }},
            {"to fp16", f32, h16, [&] { floatToHalf(x.data(), n, h.data()); }},
            {"from fp16", h16, f32, [&] { halfToFloat(h.data(), n, y.data()); }},
            {"to bf16", f32, h16, [&] { floatToBf16(x.data(), n, h.data()); }},
            {"from bf16", h16, f32, [&] { bf16ToFloat(h.data(), n, y.data()); }},
        };
        // Scale repetitions so small buffers are timed over a measurable interval.
        const int inner = std::max(1, static_cast<int>(20.0 / mb));
        for (const Op& o : ops) {
            double bestOp = 1e30, bestCopy = 1e30;
            for (int rep = 0; rep < reps; ++rep) {
                bestCopy = std::min(bestCopy, seconds([&] {
                                        for (int k = 0; k < inner; ++k)
                                            std::memcpy(y.data(), x.data(), n * 4);
                                    }));
                bestOp = std::min(bestOp, seconds([&] {
                                      for (int k = 0; k < inner; ++k) o.run();
                                  }));
            }
            Row row;
            row.op = o.name;
            row.mb = mb;
            row.bytesRead = o.read;
            row.bytesWritten = o.written;
            row.gbps = (o.read + o.written) * inner / bestOp / 1e9;
            row.memcpyGbps = 2 * f32 * inner / bestCopy / 1e9;
            row.share = row.gbps / row.memcpyGbps;
            row.timeRatio = bestCopy / bestOp;
            std::printf("%-12s %7.0f %9.2f %10.2f %12.2f %6.0f%% %10.2f\n", row.op.c_str(), mb,
                        (o.read + o.written) / 1e6, row.gbps, row.memcpyGbps, 100 * row.share, row.timeRatio);
            rows.push_back(row);
        }
    }

    const std::size_t n = 25'000'000;
    std::printf(
        "\nwire size by the size formula (compressedBytes(): arithmetic, not a measurement; bench_allreduce\n"
        "measures the bytes an exchange writes to its sockets), %zu fp32 values, chunk %zu:\n",
        n, chunk);
    std::string wire;
    for (CompressFormat f :
         {CompressFormat::Fp16, CompressFormat::Bf16, CompressFormat::Int8, CompressFormat::Int4}) {
        const double ratio = 4.0 * n / compressedBytes(n, chunk, f);
        std::printf("  %-5s %12zu bytes  %.3fx fewer than fp32 (formula)\n", compressFormatName(f),
                    compressedBytes(n, chunk, f), ratio);
        char buf[160];
        std::snprintf(buf, sizeof buf, "%s\"%s\": {\"bytes\": %zu, \"ratio_vs_fp32\": %.4f}",
                      wire.empty() ? "" : ", ", compressFormatName(f), compressedBytes(n, chunk, f), ratio);
        wire += buf;
    }
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
    std::printf(
        "target: >= 50%% of memcpy's bandwidth (bytes read + written per second): met by %zu of %zu "
        "ops x sizes%s%s\n",
        met, rows.size(), below.empty() ? "" : "; below: ", below.c_str());

    if (!outDir.empty()) {
        const std::string path = outDir + "/bench_compression.json";
        if (FILE* f = std::fopen(path.c_str(), "w")) {
            std::fprintf(f,
                         "{\n  \"bench\": \"compression\",\n  \"isa\": \"%s\",\n  \"chunk\": %zu,\n  "
                         "\"throughput\": [\n",
                         cpuIsaName(bestCpuIsa()), chunk);
            for (std::size_t i = 0; i < rows.size(); ++i)
                std::fprintf(
                    f,
                    "    {\"op\": \"%s\", \"mb\": %.0f, \"bytes_read\": %.0f, \"bytes_written\": %.0f, "
                    "\"gbps_read_written\": %.3f, \"memcpy_gbps_read_written\": %.3f, "
                    "\"share_of_memcpy_bandwidth\": %.4f, \"memcpy_time_over_op_time\": %.4f}%s\n",
                    rows[i].op.c_str(), rows[i].mb, rows[i].bytesRead, rows[i].bytesWritten, rows[i].gbps,
                    rows[i].memcpyGbps, rows[i].share, rows[i].timeRatio, i + 1 < rows.size() ? "," : "");
            std::fprintf(
                f,
                "  ],\n  \"wire_formula\": {\"note\": \"compressedBytes() arithmetic, not measured\", "
                "%s}\n}\n",
                wire.c_str());
            std::fclose(f);
            std::printf("wrote %s\n", path.c_str());
        } else {
            std::fprintf(stderr, "cannot write %s\n", path.c_str());
            return 1;
        }
    }
    return 0;
}
