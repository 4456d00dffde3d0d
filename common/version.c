/* SPDX-License-Identifier: Apache-2.0 */
/* See version.h. The revision comes from a header meson writes on every
 * build (vcs_tag), so that only this file is compiled again when it moves. */
#include "psnet-config.h"
#include "psnet-revision.h"
#include "version.h"

const char *psnet_version(void) { return PSNET_VERSION; }
const char *psnet_revision(void) { return PSNET_REVISION; }
