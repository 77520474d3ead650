-- Appends one entry of history taken out of the log to its kind's stream, if the ledger is
-- still this one and this instance still holds the compactor's lock.
-- KEYS: marker, compactor's lock, history stream
-- ARGV: marker, holder, entry id, newest record's time (ms), frames
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 'WIPED'
end
if redis.call('GET', KEYS[2]) ~= ARGV[2] then
  return 'LOCK'
end
redis.call('XADD', KEYS[3], ARGV[3], 'at', ARGV[4], 'r', ARGV[5])
return 'OK'
