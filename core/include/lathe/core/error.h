#pragma once
// Typed errors of the core library. Each carries a message a user can act on; callers catch
// them at the session boundary (CLI command, GUI session) and show them.
#include <stdexcept>
#include <string>

namespace lathe::core {

class Error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// A run configuration (TOML file, flag, form field) is invalid. lathectl exits with 2.
class ConfigError : public Error {
public:
    using Error::Error;
};

/// A data set could not be found or parsed.
class DataError : public Error {
public:
    using Error::Error;
};

/// The workspace database could not be opened, is foreign, or is newer than this build.
class StoreError : public Error {
public:
    using Error::Error;
};

/// A checkpoint is missing, truncated, or fails its checksum.
class CheckpointError : public Error {
public:
    using Error::Error;
};

/// An event stream line is malformed or of an unsupported version.
class EventStreamError : public Error {
public:
    using Error::Error;
};

}  // namespace lathe::core
