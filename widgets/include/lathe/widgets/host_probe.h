#pragma once
// The Hosts page's SSH work is remote's (lathe/remote/inventory.h: the probe and trust steps
// `lathectl hosts check|trust` uses too); its names are brought in here for the page's code.
// What stays here: the version of the lathectl beside the workbench, the one hosts must match.
#include <string>

#include "lathe/remote/inventory.h"

namespace lathe::widgets {

using remote::AddressParts;
using remote::HostKeyState;
using remote::HostProbe;
using remote::hostSpecFor;
using remote::KeyLook;
using remote::knownHostsPath;
using remote::lookAtHostKey;
using remote::probeHost;
using remote::ProbeOptions;
using remote::splitAddress;
using remote::trustHostKey;
using remote::TrustResult;

/// What `PROGRAM --version` prints (its first line, "lathectl 0.1.0"); PROGRAM empty: the lathectl
/// beside this program. The version a remote lathectl must match. Throws core::Error when it
/// cannot be run.
std::string lathectlVersion(const std::string& program = {});

}  // namespace lathe::widgets
