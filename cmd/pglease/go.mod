module github.com/pglease/pglease/cmd/pglease

go 1.25.0

require (
	github.com/jackc/pgx/v5 v5.13.0
	github.com/pglease/pglease v0.5.0
	github.com/pglease/pglease/pgleaseui v0.5.0
	github.com/stretchr/testify v1.12.1
)

require (
	github.com/go-co-op/gocron/v2 v2.22.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/jonboulle/clockwork v0.5.0 // indirect
	github.com/robfig/cron/v3 v3.0.1 // indirect
	go.uber.org/goleak v1.3.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/text v0.41.0 // indirect
)

// The command is a module of its own so that the page's module stays out
// of the library's module graph. These make the modules it requires the
// code of this repository when it is built and tested alone (GOWORK=off,
// as CI does), before their release is tagged; go.work does the same for
// development. `go install github.com/pglease/pglease/cmd/pglease@latest`
// builds the tagged release. Raise the require lines with each release.
replace (
	github.com/pglease/pglease => ../..
	github.com/pglease/pglease/pgleaseui => ../../pgleaseui
)
