#pragma once
// Shared inputs for the scale_and_check tests: adversarial float buffers, scales and lengths
// that straddle every SIMD width and tail size.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace lathe::kernels::test {

inline std::uint32_t bitsOf(float v) {
    std::uint32_t b;
    std::memcpy(&b, &v, sizeof b);
    return b;
}

inline float fromBits(std::uint32_t b) {
    float v;
    std::memcpy(&v, &b, sizeof v);
    return v;
}

enum class InputKind { Zeros, Normal, AnyBits, Denormals, HugeRange, NearMax, OneInf, OneNaN };

inline const char* kindName(InputKind k) {
    switch (k) {
        case InputKind::Zeros:
            return "zeros";
        case InputKind::Normal:
            return "normal";
        case InputKind::AnyBits:
            return "any-bits";
        case InputKind::Denormals:
            return "denormals";
        case InputKind::HugeRange:
            return "huge-range";
        case InputKind::NearMax:
            return "near-max";
        case InputKind::OneInf:
            return "one-inf";
        case InputKind::OneNaN:
            return "one-nan";
    }
    return "?";
}

inline const std::vector<InputKind>& allKinds() {
    static const std::vector<InputKind> kinds{InputKind::Zeros,     InputKind::Normal,    InputKind::AnyBits,
                                              InputKind::Denormals, InputKind::HugeRange, InputKind::NearMax,
                                              InputKind::OneInf,    InputKind::OneNaN};
    return kinds;
}

inline std::vector<float> makeInput(InputKind kind, std::size_t n, std::mt19937& rng) {
    std::vector<float> v(n);
    std::uniform_int_distribution<std::uint32_t> anyBits;
    std::uniform_int_distribution<std::uint32_t> mantissa(0, 0x7fffffu);
    std::uniform_int_distribution<std::uint32_t> sign(0, 1);
    std::normal_distribution<float> normal(0.f, 3.f);
    for (std::size_t i = 0; i < n; ++i) {
        switch (kind) {
            case InputKind::Zeros:
                v[i] = (i % 3 == 1) ? -0.f : 0.f;
                break;
            case InputKind::Normal:
                v[i] = normal(rng);
                break;
            case InputKind::AnyBits:
                v[i] = fromBits(anyBits(rng));
                break;  // includes NaN payloads, ±inf
            case InputKind::Denormals:
                v[i] = fromBits((sign(rng) << 31) | std::max<std::uint32_t>(1, mantissa(rng)));
                break;
            case InputKind::HugeRange: {
                // Every finite exponent, so products both underflow and overflow.
                std::uniform_int_distribution<std::uint32_t> exponent(0, 254);
                v[i] = fromBits((sign(rng) << 31) | (exponent(rng) << 23) | mantissa(rng));
                break;
            }
            case InputKind::NearMax:
                v[i] = fromBits((sign(rng) << 31) | (254u << 23) | mantissa(rng));
                break;
            case InputKind::OneInf:
            case InputKind::OneNaN:
                v[i] = normal(rng);
                break;
        }
    }
    if (n > 0 && (kind == InputKind::OneInf || kind == InputKind::OneNaN)) {
        // Put the bad value in the SIMD tail when there is one: the easiest place to miss it.
        const std::size_t pos = n - 1 - (n > 3 ? rng() % 3 : 0);
        v[pos] = kind == InputKind::OneInf ? -std::numeric_limits<float>::infinity()
                                           : fromBits(0x7fc01234u);  // quiet NaN with a payload
    }
    return v;
}

inline const std::vector<float>& allScales() {
    static const std::vector<float> scales{1.f,
                                           0.5f,
                                           1.f / 65536.f,
                                           65536.f,
                                           3.f,  // inexact products: rounding must match
                                           -1.f,
                                           0.f,
                                           1e-40f,  // denormal scale
                                           std::numeric_limits<float>::min(),
                                           std::numeric_limits<float>::max(),
                                           std::numeric_limits<float>::infinity(),
                                           std::numeric_limits<float>::quiet_NaN()};
    return scales;
}

inline const std::vector<std::size_t>& allLengths() {
    static const std::vector<std::size_t> lengths{0,  1,  2,  3,  7,  8,  9,    15,   16,   17,   31,
                                                  32, 33, 47, 63, 64, 65, 1000, 1023, 1024, 1025, 4099};
    return lengths;
}

// What the flag must be, computed without any of the library's code.
inline bool expectedFlag(const std::vector<float>& in, float scale) {
    for (float v : in)
        if (!std::isfinite(v) || !std::isfinite(v * scale)) return true;
    return false;
}

}  // namespace lathe::kernels::test
