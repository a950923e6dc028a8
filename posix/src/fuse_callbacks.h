#pragma once

// The FUSE low-level operations of a PosixView (fuse_callbacks.cc): what
// Mount hands fuse_session_new. Each callback finds its view in the request's
// userdata. Include <fuse_lowlevel.h> (with FUSE_USE_VERSION) to use the
// result.

struct fuse_lowlevel_ops;

namespace granary::posix {

// Every operation the view answers: lookups, attributes and listings from the
// MountTree, opens and reads through the ContentReader, EROFS for anything
// that would write.
fuse_lowlevel_ops FuseOps();

}  // namespace granary::posix
