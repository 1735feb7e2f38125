-- Health of netwave's objects (group netwave.dev, every kind) for Argo CD.
--
-- Input objects (VRFRouteConfiguration, Layer2NetworkConfiguration, RoutingTable, BGPPeering,
-- MirrorSelector, MirrorTarget) and NetworkConfigRevisions carry the kstatus conditions Ready,
-- Reconciling and Stalled, written by netwave's configurator: an input is Ready once the revision
-- that carries it has rolled out to every node, Reconciling while it rolls out, Stalled when that
-- revision failed (its nodes went back to the last good revision) or waits for an admin (held as a
-- destructive change, or paused). A sync wave or a progressive sync therefore waits for the network
-- change to reach the nodes, and stops at a failed or held one.
-- NodeNetworkConfigs carry the same conditions, written by the node's agent (0.2.0 and later): Ready
-- when the node runs the config it was given, Reconciling while it applies it, Stalled when the agent
-- refused it or rolled it back.
local hs = {}

local function condition(conditions, type)
  if conditions == nil then
    return nil
  end
  for _, c in ipairs(conditions) do
    if c.type == type then
      return c
    end
  end
  return nil
end

if obj.metadata ~= nil and obj.metadata.deletionTimestamp ~= nil then
  hs.status = "Progressing"
  hs.message = "Being deleted"
  return hs
end

local status = obj.status
if status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for netwave's configurator"
  return hs
end

-- A NodeNetworkConfig of an agent before 0.2.0 has no conditions: its phase, if it answers this spec.
if obj.kind == "NodeNetworkConfig" and condition(status.conditions, "Ready") == nil then
  local answers = obj.spec ~= nil and status.observedRevision == obj.spec.revision
  if obj.spec ~= nil and (obj.spec.revision == nil or obj.spec.revision == "") then
    hs.status = "Healthy"
    hs.message = "no config assigned"
  elseif answers and status.phase == "Provisioned" then
    hs.status = "Healthy"
  elseif answers and status.phase == "Invalid" then
    hs.status = "Degraded"
  else
    hs.status = "Progressing"
  end
  hs.message = hs.message or status.message or status.reason or ""
  return hs
end

-- A spec the configurator (for a node config: its agent) has not judged yet: whatever the conditions
-- say is about an older one.
if status.observedGeneration ~= nil and obj.metadata ~= nil and obj.metadata.generation ~= nil
    and status.observedGeneration < obj.metadata.generation then
  hs.status = "Progressing"
  local who = "netwave's configurator"
  if obj.kind == "NodeNetworkConfig" then
    who = "the node's agent"
  end
  hs.message = "Waiting for " .. who .. " to judge generation " .. obj.metadata.generation
  return hs
end

-- A superseded revision: nothing to do and nothing to wait for.
if obj.kind == "NetworkConfigRevision" and status.phase == "Superseded" then
  hs.status = "Healthy"
  hs.message = status.message or ""
  return hs
end

local stalled = condition(status.conditions, "Stalled")
local ready = condition(status.conditions, "Ready")
local reconciling = condition(status.conditions, "Reconciling")

if stalled ~= nil and stalled.status == "True" then
  -- Held or paused: nothing is wrong yet, an admin has to approve (kubectl netwave resume) or undo.
  if stalled.reason == "DestructiveChange" or stalled.reason == "RolloutPaused" then
    hs.status = "Suspended"
  else
    hs.status = "Degraded"
  end
  hs.message = stalled.message
  return hs
end
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = ready.message
  return hs
end
if reconciling ~= nil and reconciling.status == "True" then
  hs.status = "Progressing"
  hs.message = reconciling.message
  return hs
end
hs.status = "Progressing"
hs.message = "Waiting for netwave's configurator"
return hs
