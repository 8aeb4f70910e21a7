-- wrk script: spread requests over 100 tenants (X-Tenant header), so the
-- limiter works on many buckets as in production, and record nothing else.
local counter = 0
request = function()
	counter = counter + 1
	return wrk.format("GET", "/", { ["X-Tenant"] = "tenant-" .. (counter % 100) })
end
