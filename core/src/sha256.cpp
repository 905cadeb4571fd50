#include "lathe/core/sha256.h"

#include <openssl/evp.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "lathe/core/error.h"

namespace lathe::core {
struct Sha256::Impl {
    std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx{EVP_MD_CTX_new(), &EVP_MD_CTX_free};
};

Sha256::Sha256() : d(std::make_unique<Impl>()) {
    if (!d->ctx || EVP_DigestInit_ex(d->ctx.get(), EVP_sha256(), nullptr) != 1)
        throw Error("SHA-256 init failed");
}

Sha256::~Sha256() = default;

void Sha256::update(const void* p, size_t n) {
    if (EVP_DigestUpdate(d->ctx.get(), p, n) != 1) throw Error("SHA-256 update failed");
}

std::string Sha256::hex() {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    if (EVP_DigestFinal_ex(d->ctx.get(), md, &len) != 1) throw Error("SHA-256 final failed");
    static const char* digits = "0123456789abcdef";
    std::string out(2 * len, '0');
    for (unsigned i = 0; i < len; ++i) {
        out[2 * i] = digits[md[i] >> 4];
        out[2 * i + 1] = digits[md[i] & 15];
    }
    return out;
}

std::string sha256Hex(const void* data, size_t size) {
    Sha256 h;
    h.update(data, size);
    return h.hex();
}

std::string sha256File(const std::string& path) {
    std::unique_ptr<std::FILE, decltype(&std::fclose)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
    if (!f) throw Error("cannot read " + path + ": " + std::strerror(errno));
    Sha256 h;
    char buf[1 << 16];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f.get())) > 0) h.update(buf, n);
    if (std::ferror(f.get())) throw Error("error reading " + path);
    return h.hex();
}

}  // namespace lathe::core
