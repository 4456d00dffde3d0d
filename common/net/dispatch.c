/* SPDX-License-Identifier: Apache-2.0 */
/* A daemon's messages served through its table; see dispatch.h. */
#include <stdio.h>
#include "dispatch.h"
#include "zap.h"

const DispatchRow *dispatch_row(const DispatchTable *t, int type) {
        if (type < 0 || (size_t) type >= t->nrows || !(t->rows[type].fn || t->rows[type].ignore))
                return NULL;
        return &t->rows[type];
}

int dispatch_message(const DispatchTable *t, const NetIdentity *id, void *d, WireMsg *m, char *reason, size_t n) {
        int type = (int) m->hdr->type;
        if (zap_authorize(id, m, t->at_coord, reason, n) < 0)
                return PSNET__STATUS__STATUS_DENIED;
        const DispatchRow *row = dispatch_row(t, type);
        if (!row) {
                snprintf(reason, n, "%s does not serve message type %s (%d)", t->daemon, wire_type_name(type), type);
                return PSNET__STATUS__STATUS_UNKNOWN_TYPE;
        }
        if (row->ignore)
                return PSNET__STATUS__STATUS_OK;
        void *peer = NULL;
        if (row->needs_peer && !(peer = t->find_peer(d, m))) {
                snprintf(reason, n, "%s", t->no_peer_reason);
                return PSNET__STATUS__STATUS_UNKNOWN_PEER;
        }
        row->fn(d, m, peer);
        return PSNET__STATUS__STATUS_OK;
}
