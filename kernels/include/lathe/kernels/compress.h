#pragma once
// Gradient compression for distributed training: per-chunk symmetric int8/int4 quantization
// (nearest or stochastic rounding), dequantize and dequantize-accumulate for the reduce step,
// fused error feedback, and fp32 <-> fp16/bf16 conversion.
//
// Definitions every path (scalar reference, AVX2, AVX-512) follows bit for bit:
//  * Chunks: element i belongs to chunk i / chunk; the last chunk may be short. chunk == 0
//    means "one chunk for the whole buffer".
//  * Scale: amax = max |x| over the chunk; scale = amax / 127 (int8) or amax / 7 (int4), an
//    fp32 division. If the scale is 0 (an all-zero chunk, or amax so tiny that amax/127
//    underflows) every code is 0.
//  * Non-finite input: a chunk holding any inf or NaN gets scale = quiet NaN (0x7fc00000) and
//    all-zero codes, so every dequantized element of that chunk is NaN and the receiver's
//    loss scaler sees a non-finite gradient and skips the step.
//  * Code: v = clamp(x * inv, -Q, Q) (Q = 127 or 7) with inv = 1 / scale, both fp32 (a multiply
//    per element instead of a division: 1.4x the throughput); where inv is not finite (scale
//    under ~2.9e-39) v = clamp(x / scale, -Q, Q). nearest: q = rint(v) in the current
//    rounding mode (round-to-nearest-even by default; the CUDA kernels always round to nearest
//    even, so they match the CPU in the default mode); stochastic: q = floor(v) + (u < frac)
//    where frac = v - floor(v) and u = (hash(seed, indexOffset + i) >> 8) / 2^24 is a
//    counter-based uniform in [0, 1). E[q] = v up to 2^-24, and the result depends only on
//    (seed, element index): not on ISA, SIMD width or how the buffer is split across calls
//    (pass the split point as indexOffset). The counter is the low 32 bits of the index.
//  * int4: two codes per byte, element i in byte i / 2, low nibble first, two's complement in
//    [-7, 7]; packing is by global element index, so chunks need not be even-sized. An odd
//    count leaves the last high nibble 0.
//  * Dequantize: out[i] = float(q[i]) * scale[chunk]; dequantize-add: out[i] += float(q) *
//    scale, in fp32 (no FMA contraction anywhere, so paths agree). A NaN produced by the
//    accumulation is stored as the canonical quiet NaN 0x7fc00000 (x86 picks a NaN payload by
//    operand order, which compilers may swap).
//  * Error feedback: s = g + r; transmit compress(s); r = s - dequantize(compressed), in one
//    pass. Where the transmitted value is non-finite (a NaN-scale chunk, an fp16 overflow) r
//    keeps its previous value: the step is skipped anyway and the residual stays usable.
//  * fp16: IEEE binary16, round-to-nearest-even, denormals kept, overflow to inf; a NaN keeps
//    its sign and top 10 payload bits with the quiet bit set (what F16C's vcvtps2ph does).
//    fp16 -> fp32 is exact (NaNs quieted). bf16: PyTorch's c10::BFloat16 rounding (RNE on the
//    bit pattern, denormals kept, any NaN -> 0x7fc0); bf16 -> fp32 is a 16-bit shift.
//
// Pointers may be unaligned; n may be 0 (nothing is touched). Inputs and outputs must not
// overlap, except residual, which is read and written in place.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "lathe/kernels/info.h"

namespace lathe::kernels {

enum class CompressFormat { None, Fp16, Bf16, Int8, Int4 };

// "none", "fp16", "bf16", "int8", "int4".
const char* compressFormatName(CompressFormat f) noexcept;
std::optional<CompressFormat> parseCompressFormat(std::string_view name) noexcept;

// A chunk size that keeps the scale overhead under 0.2% of int8 wire bytes.
inline constexpr std::size_t kDefaultCompressChunk = 2048;

// Number of per-chunk scales for n elements (0 for n == 0; chunk == 0 means one chunk).
std::size_t chunkCount(std::size_t n, std::size_t chunk) noexcept;
// Bytes of codes alone: 4n (none), 2n (fp16/bf16), n (int8), ceil(n/2) (int4).
std::size_t codeBytes(std::size_t n, CompressFormat f) noexcept;
// Wire bytes: codeBytes plus 4 bytes per chunk scale for int8/int4.
std::size_t compressedBytes(std::size_t n, std::size_t chunk, CompressFormat f) noexcept;

struct QuantizeParams {
    std::size_t chunk = kDefaultCompressChunk;
    bool stochastic = false;
    std::uint64_t seed = 0;         // vary per step / rank / bucket
    std::uint64_t indexOffset = 0;  // global index of x[0], for the stochastic counter
};

// codes: n bytes (int8) or codeBytes(n, Int4) bytes (int4); scales: chunkCount(n, chunk).
void quantizeInt8(const float* x, std::size_t n, std::int8_t* codes, float* scales,
                  const QuantizeParams& p) noexcept;
void quantizeInt4(const float* x, std::size_t n, std::uint8_t* codes, float* scales,
                  const QuantizeParams& p) noexcept;
// Error feedback: quantizes grad + residual and leaves the quantization error in residual.
void quantizeInt8ErrorFeedback(const float* grad, float* residual, std::size_t n, std::int8_t* codes,
                               float* scales, const QuantizeParams& p) noexcept;
void quantizeInt4ErrorFeedback(const float* grad, float* residual, std::size_t n, std::uint8_t* codes,
                               float* scales, const QuantizeParams& p) noexcept;

void dequantizeInt8(const std::int8_t* codes, const float* scales, std::size_t n, std::size_t chunk,
                    float* out) noexcept;
void dequantizeInt4(const std::uint8_t* codes, const float* scales, std::size_t n, std::size_t chunk,
                    float* out) noexcept;
// out[i] += dequantized value (the reduce step; fp32 accumulation).
void dequantizeAddInt8(const std::int8_t* codes, const float* scales, std::size_t n, std::size_t chunk,
                       float* out) noexcept;
void dequantizeAddInt4(const std::uint8_t* codes, const float* scales, std::size_t n, std::size_t chunk,
                       float* out) noexcept;

void floatToHalf(const float* x, std::size_t n, std::uint16_t* out) noexcept;
void halfToFloat(const std::uint16_t* x, std::size_t n, float* out) noexcept;
void addHalfToFloat(const std::uint16_t* x, std::size_t n, float* out) noexcept;  // out += float(x)
void floatToHalfErrorFeedback(const float* grad, float* residual, std::size_t n, std::uint16_t* out) noexcept;
void floatToBf16(const float* x, std::size_t n, std::uint16_t* out) noexcept;
void bf16ToFloat(const std::uint16_t* x, std::size_t n, float* out) noexcept;
void addBf16ToFloat(const std::uint16_t* x, std::size_t n, float* out) noexcept;
void floatToBf16ErrorFeedback(const float* grad, float* residual, std::size_t n, std::uint16_t* out) noexcept;

// The same ops on an explicit code path, for tests and benchmarks. A path this CPU cannot run
// falls back to Scalar.
void quantizeInt8(const float* x, std::size_t n, std::int8_t* codes, float* scales, const QuantizeParams& p,
                  CpuIsa isa) noexcept;
void quantizeInt4(const float* x, std::size_t n, std::uint8_t* codes, float* scales, const QuantizeParams& p,
                  CpuIsa isa) noexcept;
void quantizeInt8ErrorFeedback(const float* grad, float* residual, std::size_t n, std::int8_t* codes,
                               float* scales, const QuantizeParams& p, CpuIsa isa) noexcept;
void quantizeInt4ErrorFeedback(const float* grad, float* residual, std::size_t n, std::uint8_t* codes,
                               float* scales, const QuantizeParams& p, CpuIsa isa) noexcept;
void dequantizeInt8(const std::int8_t* codes, const float* scales, std::size_t n, std::size_t chunk,
                    float* out, CpuIsa isa) noexcept;
void dequantizeInt4(const std::uint8_t* codes, const float* scales, std::size_t n, std::size_t chunk,
                    float* out, CpuIsa isa) noexcept;
void dequantizeAddInt8(const std::int8_t* codes, const float* scales, std::size_t n, std::size_t chunk,
                       float* out, CpuIsa isa) noexcept;
void dequantizeAddInt4(const std::uint8_t* codes, const float* scales, std::size_t n, std::size_t chunk,
                       float* out, CpuIsa isa) noexcept;
void floatToHalf(const float* x, std::size_t n, std::uint16_t* out, CpuIsa isa) noexcept;
void halfToFloat(const std::uint16_t* x, std::size_t n, float* out, CpuIsa isa) noexcept;
void addHalfToFloat(const std::uint16_t* x, std::size_t n, float* out, CpuIsa isa) noexcept;
void floatToHalfErrorFeedback(const float* grad, float* residual, std::size_t n, std::uint16_t* out,
                              CpuIsa isa) noexcept;
void floatToBf16(const float* x, std::size_t n, std::uint16_t* out, CpuIsa isa) noexcept;
void bf16ToFloat(const std::uint16_t* x, std::size_t n, float* out, CpuIsa isa) noexcept;
void addBf16ToFloat(const std::uint16_t* x, std::size_t n, float* out, CpuIsa isa) noexcept;
void floatToBf16ErrorFeedback(const float* grad, float* residual, std::size_t n, std::uint16_t* out,
                              CpuIsa isa) noexcept;

// The stochastic-rounding generator, exposed so tests and other backends can reproduce it:
// streamKey(seed) once per call, then streamBits(key, counter) per element.
std::uint32_t streamKey(std::uint64_t seed) noexcept;
inline std::uint32_t streamBits(std::uint32_t key, std::uint32_t counter) noexcept {
    // Two rounds of a 32-bit integer finalizer (lowbias32): cheap in 32-bit SIMD lanes.
    auto mix = [](std::uint32_t x) {
        x ^= x >> 16;
        x *= 0x7feb352du;
        x ^= x >> 15;
        x *= 0x846ca68bu;
        x ^= x >> 16;
        return x;
    };
    return mix(mix(counter ^ key) + key);
}

namespace cuda {

// Device versions with the same definitions (NaNs compare as NaN: GPUs return a canonical NaN
// rather than the CPU's payloads). All pointers are device memory; residual may be nullptr for
// plain quantization. Asynchronous on `stream` (a cudaStream_t as void*). Throw CudaError on
// launch failure or when built without CUDA.
void quantizeInt8(const float* x, float* residual, std::size_t n, std::int8_t* codes, float* scales,
                  const QuantizeParams& p, void* stream = nullptr);
void quantizeInt4(const float* x, float* residual, std::size_t n, std::uint8_t* codes, float* scales,
                  const QuantizeParams& p, void* stream = nullptr);
void dequantizeInt8(const std::int8_t* codes, const float* scales, std::size_t n, std::size_t chunk,
                    float* out, bool accumulate, void* stream = nullptr);
void dequantizeInt4(const std::uint8_t* codes, const float* scales, std::size_t n, std::size_t chunk,
                    float* out, bool accumulate, void* stream = nullptr);
// fp16 (bf16 = false) or bf16 (bf16 = true); residual nullptr: plain conversion.
void floatTo16(const float* x, float* residual, std::size_t n, std::uint16_t* out, bool bf16,
               void* stream = nullptr);
void floatFrom16(const std::uint16_t* x, std::size_t n, float* out, bool bf16, bool accumulate,
                 void* stream = nullptr);

}  // namespace cuda
}  // namespace lathe::kernels
