#!lua flags=no-writes,allow-stale
-- warden's metrics for the Prometheus Redis exporter (oliver006/redis_exporter,
-- Debian's prometheus-redis-exporter):
--
--   prometheus-redis-exporter --redis.addr redis://127.0.0.1:6379 \
--       --script scripts/warden-metrics.lua
--
-- The exporter runs this script with EVAL on every scrape and exports each
-- returned name/value pair as redis_script_values{key="<name>"} <value>.
-- <name> is written as the series it stands for, in Prometheus' own notation,
-- so that the relabelling in docs/metrics.md can make it that series:
--
--   INFO warden line                  returned names
--   warden_grants:12                  warden_grants
--   warden_lock_wait_ms:le_1=3,...    warden_lock_wait_ms_bucket{le="1"}, ...,
--     ...,le_inf=9,count=9,sum=40       warden_lock_wait_ms_bucket{le="+Inf"},
--                                       warden_lock_wait_ms_count, warden_lock_wait_ms_sum
--   warden_version:1.1.0              warden_version_info{version="1.1.0"} (value 1)
--   WARDEN.CONTENDED entries          warden_contended_waiters{db="0",kind="lock",key="orders:42"},
--                                       warden_contended_oldest_wait_ms{...},
--                                       warden_contended_total_wait_ms{...}
--
-- Every line of INFO warden is exported, so fields added later appear by
-- themselves. Nothing here may fail: an error, or a value the exporter cannot
-- read as a number, makes the exporter report the whole server down
-- (redis_up 0). The flags let it run wherever INFO does: on replicas, at
-- maxmemory, and on a replica cut off from its master.

-- How many of the most contended keys to export (WARDEN.CONTENDED COUNT).
local CONTENDED = 20

local out = {}

local function emit(name, value)
    out[#out + 1] = name
    out[#out + 1] = value
end

-- An INFO value the exporter reads as a number: kept as written, so that
-- large counters keep every digit.
local function is_number(s)
    return s:find('^%-?%d+$') ~= nil or s:find('^%-?%d+%.%d+$') ~= nil
end

-- Whether s is UTF-8 as Go (and so the exporter) accepts it: no overlong
-- forms, no surrogates, nothing past U+10FFFF.
local function is_utf8(s)
    local i, n = 1, #s
    while i <= n do
        local c = s:byte(i)
        local len, low, high = 1, 0x80, 0xBF
        if c < 0x80 then
            len = 1
        elseif c >= 0xC2 and c <= 0xDF then
            len = 2
        elseif c >= 0xE0 and c <= 0xEF then
            len = 3
            if c == 0xE0 then low = 0xA0 elseif c == 0xED then high = 0x9F end
        elseif c >= 0xF0 and c <= 0xF4 then
            len = 4
            if c == 0xF0 then low = 0x90 elseif c == 0xF4 then high = 0x8F end
        else
            return false
        end
        for j = i + 1, i + len - 1 do
            local d = s:byte(j)
            if d == nil or d < low or d > high then
                return false
            end
            low, high = 0x80, 0xBF
        end
        i = i + len
    end
    return true
end

-- A label value: control characters are written \xNN, and so are the bytes
-- past ASCII of a key that is not UTF-8 (the exporter drops such a series).
local function label(s)
    local valid = is_utf8(s)
    return (s:gsub('[%z\1-\31\127-\255]', function(c)
        local b = c:byte()
        if valid and b >= 0x80 then
            return c
        end
        return string.format('\\x%02x', b)
    end))
end

-- A dict field (k=v,k=v) whose values are all numbers, as a list of pairs.
local function dict(value)
    local items = {}
    for item in value:gmatch('[^,]+') do
        local k, v = item:match('^([%w_]+)=(.*)$')
        if k == nil or not is_number(v) then
            return nil
        end
        items[#items + 1] = { k, v }
    end
    if #items == 0 then
        return nil
    end
    return items
end

local info = redis.pcall('INFO', 'warden')
if type(info) == 'string' then
    for line in info:gmatch('[^\r\n]+') do
        local name, value = line:match('^(warden_[%w_]+):(.*)$')
        if name == nil then
            -- not a field
        elseif is_number(value) then
            emit(name, value)
        elseif dict(value) ~= nil then
            -- le_X=N: the cumulative bucket "at most X"; other keys (count,
            -- sum) become name_<key>.
            for _, kv in ipairs(dict(value)) do
                local le = kv[1]:match('^le_(.+)$')
                if le == 'inf' then
                    emit(name .. '_bucket{le="+Inf"}', kv[2])
                elseif le ~= nil then
                    emit(name .. '_bucket{le="' .. le .. '"}', kv[2])
                else
                    emit(name .. '_' .. kv[1], kv[2])
                end
            end
        else
            emit(name .. '_info{' .. name:sub(8) .. '="' .. label(value) .. '"}', '1')
        end
    end
end

-- Keys with clients waiting now, most waiters first (servers whose warden
-- has no WARDEN.CONTENDED answer an error here, and export none).
local contended = redis.pcall('WARDEN.CONTENDED', 'COUNT', tostring(CONTENDED))
if type(contended) == 'table' and contended.err == nil then
    for _, entry in ipairs(contended) do
        -- RESP2 maps arrive as flat field/value lists.
        local fields = {}
        for i = 1, #entry - 1, 2 do
            fields[entry[i]] = entry[i + 1]
        end
        local key, db, kind = fields['key'], fields['db'], fields['kind']
        if type(kind) ~= 'string' then
            kind = '' -- a warden that does not report the kind (1.1.0): no kind label
        end
        if type(key) == 'string' and type(db) == 'number' then
            local labels = '{db="' .. string.format('%d', db) .. '",kind="' .. label(kind)
                .. '",key="' .. label(key) .. '"}'
            for i = 1, #entry - 1, 2 do
                local field, value = entry[i], entry[i + 1]
                if field ~= 'key' and field ~= 'db' and type(value) == 'number' then
                    emit('warden_contended_' .. field .. labels, string.format('%.0f', value))
                end
            end
        end
    end
end

return out
