-- Kompaktor conditional mutation, evaluated atomically inside Redis: the function mutate(spec),
-- run by the mutation script (ARGV[1] = spec as JSON, store/base.py) and by the reserving script
-- (lua/reserve.lua, which fills a spec from a template for the job it pops).
-- spec = {id?, now, table?, table_conds?, table_ops?, table_reads?, tablets = [{id, conds, ops}]}
-- Every condition of every tablet is checked first; only if all hold are the ops applied.
-- Returns the outcome as JSON and whether it was applied: {ok=true, versions=[...],
-- table?={field=value}, reserved?={tablet id={...}}}, true or {ok=false, cond=..., tablet=...,
-- detail=...}, false. ``table`` holds the table_reads fields of the table hash after the ops;
-- ``reserved`` what add_running with output naming chose (see there).

local function fail(cond, tablet, detail)
  return cjson.encode({ok = false, cond = cond, tablet = tablet or '', detail = detail or ''}), false
end

local function isnull(v) return v == nil or v == cjson.null end

local function running_files(doc)
  local s = {}
  if doc.running then
    for _, r in pairs(doc.running) do
      for _, f in ipairs(r.files) do s[f] = true end
    end
  end
  return s
end

-- nil when the tablet's files are exactly ``files`` (a list), else why not
local function not_exactly(doc, files)
  local want = {}
  local n = 0
  for _, f in ipairs(files) do want[f] = true; n = n + 1 end
  local m = 0
  for f, _ in pairs(doc.files) do
    if not want[f] then return 'new file ' .. f end
    m = m + 1
  end
  if m ~= n then return 'a file is gone' end
  return nil
end

-- Timestamps here are tokens (model/tablet.py ts_token): fixed-width digit strings that compare
-- as the int64 timestamps do, never Lua numbers (doubles would round a nanosecond timestamp).
local TS_LOW = '00000000000000000000'  -- older than any timestamp: a bound that is unknown

local function tmax(a, b)
  if isnull(a) then return b end
  if isnull(b) or a >= b then return a end
  return b
end

-- the oldest put a file holds (TS_LOW when not recorded: it may hold any)
local function pmin_of(meta)
  if isnull(meta.pmin) then return TS_LOW end
  return meta.pmin
end

-- the newest delete marker among ``files`` of the tablet, or nil; a file with deletes but no
-- recorded bound (registered before bounds were recorded) counts as ``unknown``
local function files_dmax(doc, files, unknown)
  local m = nil
  for _, f in ipairs(files) do
    local meta = doc.files[f]
    if not isnull(meta) then
      if not isnull(meta.dmax) then m = tmax(m, meta.dmax)
      elseif (meta.deletes or 0) > 0 then m = tmax(m, unknown) end
    end
  end
  return m
end

-- nil when committing the full compaction ``r`` hides nothing: else the tablet's file that
-- arrived after it reserved and holds a put its inputs' delete markers may hide (dropping the
-- markers would make that put visible)
local function hidden_by_drop(doc, r, unknown)
  local dm = files_dmax(doc, r.files, unknown)
  if dm == nil then return nil end
  local inputs = {}
  for _, f in ipairs(r.files) do inputs[f] = true end
  for f, meta in pairs(doc.files) do
    if not inputs[f] and pmin_of(meta) <= dm then return f end
  end
  return nil
end

-- the compaction ``ecid`` committed: its inputs are replaced by ``output`` (nil: it was empty)
-- with ``meta``, whose timestamp bounds come from the inputs; a full compaction dropped its
-- inputs' delete markers, so the tablet's delete horizon rises to the newest of them
local function compacted(doc, ecid, output, meta, full, unknown)
  local r = doc.running[ecid]
  local dm = files_dmax(doc, r.files, unknown)
  if not isnull(output) then
    local pmin = nil
    for _, f in ipairs(r.files) do
      local m = doc.files[f]
      if not isnull(m) and (pmin == nil or pmin_of(m) < pmin) then pmin = pmin_of(m) end
    end
    meta.pmin = pmin
    if not full then meta.dmax = dm else meta.dmax = nil end
  end
  if full then doc.dh = tmax(doc.dh, dm) end
  for _, f in ipairs(r.files) do doc.files[f] = nil end
  if not isnull(output) then doc.files[output] = meta end
end

local function sel_set(doc)
  local s = {}
  if not isnull(doc.sel) then
    for _, f in ipairs(doc.sel.files) do s[f] = true end
  end
  return s
end

-- Every op name must be listed here (a new op: add it, else mutations using it are rejected as
-- 'unknown operation'); ops are validated before any write, see the tablet conditions below.
local TABLET_OPS = {create = true, delete = true, add_files = true, remove_files = true, add_running = true,
  remove_running = true, remove_inputs = true, set_selection = true, clear_selection = true,
  selection_replace = true, ucomp_done = true, set_hold = true, clear_hold = true, set_op = true, clear_op = true, set_range = true,
  drop_heartbeat = true, count_commit = true, selection_done = true, raise_horizon = true, compacted = true}
local TABLE_OPS = {create = true, set_state = true, set_prop = true, unname = true, ucomp_register = true,
  write_done = true}

local function touch_all_tablets(tid)
  local ends = redis.call('ZRANGE', K.tablets(tid), 0, -1)
  for _, e in ipairs(ends) do redis.call('SADD', K.dirty, tid .. ';' .. e) end
end

-- the selection's files ``inputs`` were compacted into ``output`` (nil: the output was empty)
local function sel_replace(doc, inputs, output)
  local drop = {}
  for _, f in ipairs(inputs) do drop[f] = true end
  local keep = {}
  for _, f in ipairs(doc.sel.files) do if not drop[f] then table.insert(keep, f) end end
  if not isnull(output) then table.insert(keep, output) end
  doc.sel.files = keep
  doc.sel.done = (doc.sel.done or 0) + 1
end

local function ucomp_done(cid, tablet_id)
  redis.call('SADD', K.ucomp_done(cid), tablet_id)
end

local function mutate(spec)
  -- Idempotence: the client retries a call whose connection broke, but the first attempt may
  -- have been applied; a mutation id seen before returns the recorded outcome instead of being
  -- evaluated again (which would report a spurious rejection for a mutation that succeeded).
  local done_key = nil
  if not isnull(spec.id) then
    done_key = K.mutation(spec.id)
    local prev = redis.call('GET', done_key)
    if prev then return prev end
  end

  -- Fencing: a coordinator's mutation carries its fencing token; once a newer coordinator has
  -- taken over (a higher token in K.fence) the mutation is refused, nothing written.
  if not isnull(spec.fence) and tonumber(redis.call('GET', K.fence) or '0') > spec.fence then
    return fail('fenced', '', 'fencing token ' .. spec.fence .. ' is stale: a newer coordinator leads')
  end

  -- table conditions (and table ops checked before anything is written)
  local tk = nil
  if #(spec.table_ops or {}) > 0 and isnull(spec.table) then return fail('table given', '', 'table ops need a table') end
  if not isnull(spec.table) then
    tk = K.table(spec.table)
    -- the table's state, read once for 'exists' and 'state_in' (every table hash has one: the
    -- create op sets it); false when there is no table
    local state = nil
    for _, c in ipairs(spec.table_conds or {}) do
      local name = c[1]
      if (name == 'exists' or name == 'state_in') and state == nil then state = redis.call('HGET', tk, 'state') end
      if name == 'exists' then
        if not state then return fail('table exists', '', spec.table) end
      elseif name == 'absent' then
        if redis.call('EXISTS', tk) == 1 then return fail('table absent', '', spec.table) end
        if redis.call('HEXISTS', K.tables, c[2]) == 1 then return fail('table name free', '', c[2]) end
      elseif name == 'request_free' then
        -- no user compaction was started for outside request c[2] yet (ucomp_register binds it)
        local cid = redis.call('GET', K.request(c[2]))
        if cid then return fail('request free', '', cid) end
      elseif name == 'write_new' then
        -- no write with id c[2] was imported into the table yet (write_done records it)
        if redis.call('HEXISTS', K.writes(spec.table), c[2]) == 1 then return fail('write new', '', c[2]) end
      elseif name == 'state_in' then
        local okst = false
        for _, want in ipairs(c[2]) do if state == want then okst = true end end
        if not okst then return fail('table state', '', 'table ' .. spec.table .. ' is ' .. tostring(state)) end
      else
        return fail('unknown table condition', '', name)
      end
    end
    local exists = #(spec.table_ops or {}) > 0 and redis.call('EXISTS', tk) == 1
    for _, op in ipairs(spec.table_ops or {}) do
      if not TABLE_OPS[op[1]] then return fail('unknown operation', '', tostring(op[1])) end
      if op[1] == 'write_done' and type(op[2]) ~= 'string' then
        return fail('bad operation', '', 'write_done needs a write id')
      end
      if op[1] == 'ucomp_register' and (type(op[2]) ~= 'string' or type(op[3]) ~= 'table') then
        return fail('bad operation', '', 'ucomp_register needs an id and a record')
      end
      if op[1] == 'create' then
        if exists then return fail('table absent', '', spec.table) end
        exists = true
      elseif not exists then
        return fail('table exists', '', spec.table)
      end
    end
  end

  -- tablet conditions
  local docs = {}
  for i, t in ipairs(spec.tablets or {}) do
    local raw = redis.call('GET', K.tablet(t.id))
    local doc = nil
    if raw then doc = cjson.decode(raw) end
    for _, c in ipairs(t.conds or {}) do
      local name = c[1]
      if name == 'absent' then
        if doc then return fail('tablet absent', t.id) end
      elseif not doc then
        return fail('tablet exists', t.id, 'tablet ' .. t.id .. ' no longer exists')
      elseif name == 'exists' then
        -- ok
      elseif name == 'files_present' then
        for _, f in ipairs(c[2]) do
          if isnull(doc.files[f]) then return fail('files present', t.id, f) end
        end
      elseif name == 'files_free' then
        local rf = running_files(doc)
        for _, f in ipairs(c[2]) do
          if rf[f] then return fail('files not compacting', t.id, f) end
        end
      elseif name == 'files_exactly' then
        local why = not_exactly(doc, c[2])
        if why then return fail('files unchanged', t.id, why) end
      elseif name == 'ecid' then
        if isnull(doc.running[c[2]]) then return fail('compaction registered', t.id, c[2]) end
      elseif name == 'ecid_inputs_present' then
        -- the compaction c[2] is registered and its files are all still the tablet's ('ecid' and
        -- 'files_present' of its files, which the spec need not name)
        local r = doc.running[c[2]]
        if isnull(r) then return fail('compaction registered', t.id, c[2]) end
        for _, f in ipairs(r.files) do
          if isnull(doc.files[f]) then return fail('files present', t.id, f) end
        end
      elseif name == 'above_horizon' then
        -- every put of the files being added is newer than the tablet's delete horizon (c[2]: the
        -- oldest put among them, a token): none can be one a dropped delete marker hid
        if not isnull(doc.dh) and c[2] <= doc.dh then
          return fail('delete horizon', t.id, 'horizon ' .. doc.dh .. ' oldest put ' .. c[2])
        end
      elseif name == 'hides_nothing' then
        -- committing the full compaction c[2] makes no put of a file that arrived after it
        -- reserved visible (c[3]: the bound for a file whose delete markers were not recorded)
        local r = doc.running[c[2]]
        if isnull(r) then return fail('compaction registered', t.id, c[2]) end
        local f = hidden_by_drop(doc, r, c[3])
        if f then return fail('deletes hide a new file', t.id, f) end
      elseif name == 'no_running' then
        if next(doc.running) ~= nil then return fail('no running compactions', t.id) end
      elseif name == 'no_op' then
        if not isnull(doc.op) then return fail('no operation in progress', t.id, doc.op) end
      elseif name == 'no_hold' then
        if not isnull(doc.hold) then return fail('no user compaction pending', t.id, doc.hold) end
      elseif name == 'hold_is' then
        if doc.hold ~= c[2] then return fail('user compaction pending', t.id, tostring(c[2])) end
      elseif name == 'no_selection' then
        if not isnull(doc.sel) then return fail('no selection', t.id, doc.sel.id) end
      elseif name == 'selection_is' then
        if isnull(doc.sel) or doc.sel.id ~= c[2] then return fail('selection', t.id, tostring(c[2])) end
      elseif name == 'files_in_selection' then
        local s = sel_set(doc)
        for _, f in ipairs(c[2]) do
          if not s[f] then return fail('files selected', t.id, f) end
        end
      elseif name == 'files_not_selected' then
        local s = sel_set(doc)
        for _, f in ipairs(c[2]) do
          if s[f] then return fail('files not selected', t.id, f) end
        end
      elseif name == 'version' then
        if doc.v ~= c[2] then return fail('tablet unchanged', t.id, 'version ' .. tostring(doc.v)) end
      elseif name == 'range' then
        -- the tablet still starts after row c[2] (hex, or null for the first tablet): a split or
        -- merge keeps a tablet's id (its end row) but changes where it starts
        if isnull(c[2]) ~= isnull(doc.prev) or (not isnull(c[2]) and doc.prev ~= c[2]) then
          return fail('tablet range unchanged', t.id, 'it now starts after ' .. tostring(doc.prev))
        end
      else
        return fail('unknown condition', t.id, name)
      end
    end
    -- the ops must be known and apply to a tablet that exists (or is created here): a Lua error
    -- half-way through the writes below would leave the mutation half-applied.
    local have, has_sel = doc ~= nil, doc ~= nil and not isnull(doc.sel)
    for _, op in ipairs(t.ops or {}) do
      local name = op[1]
      if not TABLET_OPS[name] then return fail('unknown operation', t.id, tostring(name)) end
      if name == 'create' then
        if have then return fail('tablet absent', t.id) end
        have = true
      elseif not have then
        return fail('tablet exists', t.id, 'tablet ' .. t.id .. ' does not exist')
      elseif name == 'delete' then
        have = false
      elseif name == 'set_selection' then
        has_sel = true
      elseif name == 'clear_selection' then
        has_sel = false
      elseif (name == 'selection_replace' or name == 'selection_done') and not has_sel then
        return fail('selection', t.id, 'no selection to update')
      elseif name == 'selection_done' then
        has_sel = false  -- it may clear the selection
      elseif name == 'add_running' and (type(op[3]) ~= 'table' or type(op[3].group) ~= 'string') then
        return fail('bad operation', t.id, 'add_running needs a compaction with a group')
      elseif name == 'add_running' and not isnull(op[4]) and (type(op[4]) ~= 'table'
          or type(op[4].full) ~= 'string' or type(op[4].partial) ~= 'string' or type(op[3].files) ~= 'table'
          or not pcall(string.format, op[4].template, op[4].full, 1)) then
        return fail('bad operation', t.id, 'add_running output naming needs a template, full and partial')
      elseif (name == 'drop_heartbeat' or name == 'count_commit') and type(op[2]) ~= 'string' then
        return fail('bad operation', t.id, name .. ' needs a string')
      elseif (name == 'remove_inputs' or name == 'compacted') and (type(op[2]) ~= 'string' or not doc
          or not doc.running or isnull(doc.running[op[2]])) then
        return fail('bad operation', t.id, name .. ' needs a registered compaction')
      elseif name == 'compacted' and (type(op[6]) ~= 'string' or (not isnull(op[3]) and type(op[4]) ~= 'table')) then
        return fail('bad operation', t.id, 'compacted needs an output with its metadata and a bound')
      elseif name == 'raise_horizon' and type(op[2]) ~= 'string' then
        return fail('bad operation', t.id, 'raise_horizon needs a timestamp token')
      end
    end
    docs[i] = doc
  end

  -- table ops
  for _, op in ipairs(spec.table_ops or {}) do
    local name = op[1]
    if name == 'create' then
      redis.call('HSET', tk, 'name', op[2], 'state', 'ONLINE', 'props', op[3], 'created', tostring(spec.now))
      redis.call('HSET', K.tables, op[2], spec.table)
    elseif name == 'set_state' then
      redis.call('HSET', tk, 'state', op[2])
      touch_all_tablets(spec.table)
    elseif name == 'set_prop' then
      local props = cjson.decode(redis.call('HGET', tk, 'props') or '{}')
      if isnull(op[3]) then props[op[2]] = nil else props[op[2]] = op[3] end
      if next(props) == nil then redis.call('HSET', tk, 'props', '{}')
      else redis.call('HSET', tk, 'props', cjson.encode(props)) end
      touch_all_tablets(spec.table)
    elseif name == 'unname' then
      redis.call('HDEL', K.tables, op[2])
    elseif name == 'write_done' then
      -- a client's write op[2] (a Spark job, a stream's micro-batch) imported: never again
      redis.call('HSET', K.writes(spec.table), op[2], tostring(spec.now))
    elseif name == 'ucomp_register' then
      -- a user compaction op[2] with record op[3] (field -> string), registered together with its
      -- holds (this mutation's set_hold ops); op[4] = outside request id bound to it (or null) for
      -- op[5] seconds
      for f, v in pairs(op[3]) do redis.call('HSET', K.ucomp(op[2]), f, v) end
      redis.call('SADD', K.ucomps, op[2])
      if not isnull(op[4]) then redis.call('SET', K.request(op[4]), op[2], 'EX', op[5]) end
    end
  end

  -- tablet ops
  local versions = {}
  local reserved = nil
  for i, t in ipairs(spec.tablets or {}) do
    local doc = docs[i]
    local key = K.tablet(t.id)
    local deleted = false
    for _, op in ipairs(t.ops or {}) do
      local name = op[1]
      if name == 'create' then
        doc = op[2]
        doc.v = 0
        redis.call('ZADD', K.tablets(doc.table), 0, op[3])
      elseif name == 'delete' then
        for ecid, r in pairs(doc.running) do
          redis.call('HDEL', K.running, ecid)
          redis.call('SREM', K.rgroup(r.group), ecid)
        end
        redis.call('ZREM', K.tablets(doc.table), op[2])
        deleted = true
      elseif name == 'add_files' then
        for f, meta in pairs(op[2]) do doc.files[f] = meta end
      elseif name == 'remove_files' then
        for _, f in ipairs(op[2]) do doc.files[f] = nil end
      elseif name == 'remove_inputs' then
        -- the files of the running compaction op[2] (an op before its remove_running)
        local r = doc.running[op[2]]
        if r then for _, f in ipairs(r.files) do doc.files[f] = nil end end
      elseif name == 'compacted' then
        compacted(doc, op[2], op[3], op[4], op[5] == true, op[6])
      elseif name == 'raise_horizon' then
        doc.dh = tmax(doc.dh, op[2])
      elseif name == 'add_running' then
        if not isnull(op[4]) then
          -- output naming {template, full, partial}: the output is the template filled with the
          -- full or partial prefix and a new file sequence number; full = the compaction's files
          -- are exactly the tablet's files now. Both are decided here, atomically with the
          -- registration, and reported in the reply with the tablet's range.
          local seq = redis.call('HINCRBY', K.seq, 'file', 1)
          local full = not_exactly(doc, op[3].files) == nil
          op[3].output = string.format(op[4].template, full and op[4].full or op[4].partial, seq)
          reserved = reserved or {}
          reserved[t.id] = {output = op[3].output, full = full, prev = doc.prev, ['end'] = doc['end']}
        end
        doc.running[op[2]] = op[3]
        redis.call('HSET', K.running, op[2], t.id)
        redis.call('SADD', K.rgroup(op[3].group), op[2])
      elseif name == 'remove_running' then
        local r = doc.running[op[2]]
        if r and not isnull(r) then redis.call('SREM', K.rgroup(r.group), op[2]) end
        doc.running[op[2]] = nil
        redis.call('HDEL', K.running, op[2])
      elseif name == 'set_selection' then
        doc.sel = op[2]
      elseif name == 'clear_selection' then
        doc.sel = nil
      elseif name == 'selection_replace' then
        sel_replace(doc, op[2], op[3])
      elseif name == 'selection_done' then
        -- a compaction of the selection's files op[2] into op[3] committed: with no other selected
        -- file left the selection is complete (cleared; a user compaction op[4] records the tablet
        -- done), else its inputs are replaced by the output
        local inputs = {}
        for _, f in ipairs(op[2]) do inputs[f] = true end
        local rest = false
        for _, f in ipairs(doc.sel.files) do if not inputs[f] then rest = true end end
        if rest then
          sel_replace(doc, op[2], op[3])
        else
          doc.sel = nil
          if not isnull(op[4]) then ucomp_done(op[4], t.id) end
        end
      elseif name == 'ucomp_done' then
        ucomp_done(op[2], t.id)
      elseif name == 'set_hold' then
        doc.hold = op[2]
      elseif name == 'clear_hold' then
        doc.hold = nil
      elseif name == 'set_op' then
        doc.op = op[2]
      elseif name == 'clear_op' then
        doc.op = nil
      elseif name == 'set_range' then
        doc.prev = op[2]
      elseif name == 'drop_heartbeat' then
        redis.call('DEL', K.heartbeat(op[2]))
      elseif name == 'count_commit' then
        -- the committed counters (global, per group) and COMMITS_BY_TABLET; op[2] is the group
        redis.call('HINCRBY', K.counters, 'compactions_committed', 1)
        redis.call('HINCRBY', K.counters, 'committed:' .. op[2], 1)
        redis.call('HINCRBY', K.commits, t.id, 1)
        if type(op[3]) == 'string' then  -- the ECID: a commit applied twice would show twice
          if redis.call('RPUSH', K.commitlog, op[3]) > 100000 then redis.call('LTRIM', K.commitlog, -100000, -1) end
        end
      end
    end
    if deleted then
      redis.call('DEL', key)
      redis.call('SREM', K.dirty, t.id)
      versions[i] = -1
    elseif doc and #(t.ops or {}) > 0 then
      doc.v = (doc.v or 0) + 1
      redis.call('SET', key, cjson.encode(doc))
      redis.call('SADD', K.dirty, t.id)
      versions[i] = doc.v
    else
      versions[i] = doc and doc.v or -1
    end
  end
  local reply = {ok = true, versions = versions, reserved = reserved}
  if tk and #(spec.table_reads or {}) > 0 then
    local vals = redis.call('HMGET', tk, unpack(spec.table_reads))
    reply.table = {}
    for i, f in ipairs(spec.table_reads) do
      if vals[i] then reply.table[f] = vals[i] else reply.table[f] = cjson.null end
    end
  end
  local result = cjson.encode(reply)
  if done_key then redis.call('SET', done_key, result, 'EX', 600) end
  return result, true
end
