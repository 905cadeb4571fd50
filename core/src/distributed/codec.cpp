// The gradient codec: fp16/bf16/int8/int4 messages with error feedback (exchange.h), on our
// CPU kernels or, where the collectives take GPU tensors, their CUDA versions.
#include "distributed/exchange.h"
#include "lathe/core/error.h"
#include "lathe/kernels/cuda_device.h"

namespace lathe::core {

namespace kc = lathe::kernels;

Codec::Codec(const CompressOptions& options, torch::Device commDevice)
    : m_options(options), m_device(commDevice) {
    const auto format = kc::parseCompressFormat(options.format);
    if (!format)
        throw ConfigError("`compress` must be none, fp16, bf16, int8 or int4 (got '" + options.format + "')");
    m_format = *format;
    if (onGpu() && compressed() && !kc::cudaCompiled())
        throw ConfigError("`compress` " + options.format +
                          " on NCCL needs Lathe's CUDA kernels, and this build has "
                          "none (configure with the CUDA toolkit, LATHE_CUDA=ON); or use backend = \"gloo\"");
}

int64_t Codec::messageBytes(int64_t n) const {
    return static_cast<int64_t>(
        kc::compressedBytes(static_cast<size_t>(n), static_cast<size_t>(m_options.chunk), m_format));
}

uint64_t Codec::seed(int64_t step, size_t bucket, int rank) const {
    return m_options.seed * 0x9E3779B97F4A7C15ull ^ (static_cast<uint64_t>(step) << 20) ^
           (static_cast<uint64_t>(bucket) << 8) ^ static_cast<uint64_t>(rank);
}

// x (n floats) -> message bytes; with error feedback the residual takes the error.
void Codec::encode(const float* x, float* residual, int64_t n, uint8_t* msg, uint64_t seed,
                   uint64_t offset) const {
    const auto un = static_cast<size_t>(n);
    kc::QuantizeParams q;
    q.chunk = static_cast<size_t>(m_options.chunk);
    q.stochastic = m_options.stochastic;
    q.seed = seed;
    q.indexOffset = offset;
    auto* scales = reinterpret_cast<float*>(msg + kc::codeBytes(un, m_format));
    if (onGpu()) {  // on the current (default) stream, which NCCL's stream waits for
        switch (m_format) {
            case kc::CompressFormat::Int8:
                kc::cuda::quantizeInt8(x, residual, un, reinterpret_cast<int8_t*>(msg), scales, q);
                break;
            case kc::CompressFormat::Int4:
                kc::cuda::quantizeInt4(x, residual, un, msg, scales, q);
                break;
            case kc::CompressFormat::Fp16:
            case kc::CompressFormat::Bf16:
                kc::cuda::floatTo16(x, residual, un, reinterpret_cast<uint16_t*>(msg),
                                    m_format == kc::CompressFormat::Bf16);
                break;
            case kc::CompressFormat::None:
                break;
        }
        return;
    }
    switch (m_format) {
        case kc::CompressFormat::Int8:
            if (residual)
                kc::quantizeInt8ErrorFeedback(x, residual, un, reinterpret_cast<int8_t*>(msg), scales, q);
            else
                kc::quantizeInt8(x, un, reinterpret_cast<int8_t*>(msg), scales, q);
            break;
        case kc::CompressFormat::Int4:
            if (residual)
                kc::quantizeInt4ErrorFeedback(x, residual, un, msg, scales, q);
            else
                kc::quantizeInt4(x, un, msg, scales, q);
            break;
        case kc::CompressFormat::Fp16:
            if (residual)
                kc::floatToHalfErrorFeedback(x, residual, un, reinterpret_cast<uint16_t*>(msg));
            else
                kc::floatToHalf(x, un, reinterpret_cast<uint16_t*>(msg));
            break;
        case kc::CompressFormat::Bf16:
            if (residual)
                kc::floatToBf16ErrorFeedback(x, residual, un, reinterpret_cast<uint16_t*>(msg));
            else
                kc::floatToBf16(x, un, reinterpret_cast<uint16_t*>(msg));
            break;
        case kc::CompressFormat::None:
            break;
    }
}

// message -> out (add: accumulate in FP32).
void Codec::decode(const uint8_t* msg, int64_t n, float* out, bool add) const {
    const auto un = static_cast<size_t>(n);
    const auto chunk = static_cast<size_t>(m_options.chunk);
    const auto* scales = reinterpret_cast<const float*>(msg + kc::codeBytes(un, m_format));
    if (onGpu()) {
        switch (m_format) {
            case kc::CompressFormat::Int8:
                kc::cuda::dequantizeInt8(reinterpret_cast<const int8_t*>(msg), scales, un, chunk, out, add);
                break;
            case kc::CompressFormat::Int4:
                kc::cuda::dequantizeInt4(msg, scales, un, chunk, out, add);
                break;
            case kc::CompressFormat::Fp16:
            case kc::CompressFormat::Bf16:
                kc::cuda::floatFrom16(reinterpret_cast<const uint16_t*>(msg), un, out,
                                      m_format == kc::CompressFormat::Bf16, add);
                break;
            case kc::CompressFormat::None:
                break;
        }
        return;
    }
    switch (m_format) {
        case kc::CompressFormat::Int8:
            if (add)
                kc::dequantizeAddInt8(reinterpret_cast<const int8_t*>(msg), scales, un, chunk, out);
            else
                kc::dequantizeInt8(reinterpret_cast<const int8_t*>(msg), scales, un, chunk, out);
            break;
        case kc::CompressFormat::Int4:
            if (add)
                kc::dequantizeAddInt4(msg, scales, un, chunk, out);
            else
                kc::dequantizeInt4(msg, scales, un, chunk, out);
            break;
        case kc::CompressFormat::Fp16:
            if (add)
                kc::addHalfToFloat(reinterpret_cast<const uint16_t*>(msg), un, out);
            else
                kc::halfToFloat(reinterpret_cast<const uint16_t*>(msg), un, out);
            break;
        case kc::CompressFormat::Bf16:
            if (add)
                kc::addBf16ToFloat(reinterpret_cast<const uint16_t*>(msg), un, out);
            else
                kc::bf16ToFloat(reinterpret_cast<const uint16_t*>(msg), un, out);
            break;
        case kc::CompressFormat::None:
            break;
    }
}

}  // namespace lathe::core
