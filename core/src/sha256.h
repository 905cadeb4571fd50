#pragma once
// SHA-256 through OpenSSL's EVP interface (checkpoints and model artifacts).
#include <cstddef>
#include <string>

namespace lathe::core {

std::string sha256Hex(const void* data, size_t size);
/// Throws Error when the file cannot be read.
std::string sha256File(const std::string& path);

}  // namespace lathe::core
