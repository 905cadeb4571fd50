#pragma once
// What the other parts of remote/ (SFTP) need of a session's libssh handle; private to remote/.
#include <libssh/libssh.h>

#include <string>

#include "lathe/remote/ssh_session.h"

namespace lathe::remote::detail {

struct SessionAccess {
    // The connected session's handle; throws SshError (Kind::Usage) when not connected.
    static ssh_session native(SshSession& s);
    // After a broken connection: isConnected() says false, connect() starts afresh.
    static void markLost(SshSession& s) noexcept;
    static std::string label(const SshSession& s);
    static std::string error(const SshSession& s);
};

}  // namespace lathe::remote::detail
