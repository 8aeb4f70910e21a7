package config

// NormalizeJSON is normalizeJSON for the tests of package config_test.
var NormalizeJSON = normalizeJSON
