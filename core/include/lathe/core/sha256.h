#pragma once
// SHA-256 through OpenSSL's EVP interface (checkpoints, model artifacts, files staged to hosts).
#include <cstddef>
#include <string>

namespace lathe::core {

/// Lower-case hex digest.
std::string sha256Hex(const void* data, size_t size);
/// Lower-case hex digest of a file. Throws Error when the file cannot be read.
std::string sha256File(const std::string& path);

}  // namespace lathe::core
