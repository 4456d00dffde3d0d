/* SPDX-License-Identifier: Apache-2.0 */
/* The release (meson's project version) and the source it was built from:
 * `git describe --always --dirty` of the tree at build time, or "unknown"
 * for a tree without git (a release tarball, an sdist). Every program's
 * --version and every daemon's psnet_build_info say both. */
#pragma once

/* "0.1.0" */
const char *psnet_version(void);
/* "afcf583a1b2c", "afcf583a1b2c-dirty" or "unknown" */
const char *psnet_revision(void);
