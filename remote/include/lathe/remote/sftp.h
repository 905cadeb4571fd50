#pragma once
// Files to and from a host over SFTP (libssh's), checked end to end: the size the host reports
// and the SHA-256 it computes (`sha256sum` there) must equal this side's, or the copy is refused
// and removed. A half-copied file never appears under its final name on either side.

#include <cstdint>
#include <string>

#include "lathe/remote/ssh_session.h"

namespace lathe::remote {

struct TransferResult {
    std::uint64_t bytes = 0;
    std::string sha256;  // lower-case hex, as sha256sum prints it
};

// Copies a local file to `remotePath` on the session's host (relative paths start at the login's
// home); missing parent directories are created. Written as `remotePath.part-<random>`, then renamed, with
// permissions `mode`. Throws SshError (Kind::Transfer) naming the file and what differed.
TransferResult upload(SshSession& session, const std::string& localPath, const std::string& remotePath,
                      int mode = 0644);

// Copies `remotePath` from the host to `localPath` (written beside as .part, renamed when
// complete and checked). `expectedSha256`, when given, must match too (e.g. the digest a
// checkpoint event carried).
TransferResult download(SshSession& session, const std::string& remotePath, const std::string& localPath,
                        const std::string& expectedSha256 = {});

// Whether a file is at `remotePath` on the host (false when the host says there is none; throws
// SshError when it cannot be asked).
bool remoteFileExists(SshSession& session, const std::string& remotePath);

// sha256sum of a file on the host (lower-case hex). Throws SshError when it cannot be read.
std::string remoteSha256(SshSession& session, const std::string& remotePath);

// `text` as one word for a POSIX shell: 'it'\''s'.
std::string shellQuote(const std::string& text);

}  // namespace lathe::remote
