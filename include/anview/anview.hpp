// Everything a user of Anview includes.
#pragma once

#include "anview/collectives.hpp"
#include "anview/communicator.hpp"
#include "anview/error.hpp"
#include "anview/host_buffer.hpp"
#include "anview/memory.hpp"
#include "anview/message.hpp"
#include "anview/metrics.hpp"
#include "anview/param_server.hpp"
#include "anview/pubsub.hpp"
#include "anview/request.hpp"
#include "anview/rpc.hpp"
#include "anview/store.hpp"
#include "anview/types.hpp"
