module github.com/pglease/pglease/pgleaseui

go 1.25.0

require (
	github.com/chromedp/cdproto v0.159.0
	github.com/chromedp/chromedp v0.23.0
	github.com/jackc/pgx/v5 v5.13.0
	github.com/pglease/pglease v0.5.0
	github.com/stretchr/testify v1.12.1
)

require (
	github.com/go-co-op/gocron/v2 v2.22.0 // indirect
	github.com/go-json-experiment/json v0.0.0-20260213210345-44df1a37e875 // indirect
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

// A user of pgleaseui gets the root module at the version required above:
// a replace applies only in the module the go command runs in. This one
// makes that module the code of this repository when pgleaseui is checked
// and tested alone (GOWORK=off, as CI does), before its release is tagged;
// go.work does the same for development. Raise the require line with each
// release.
replace github.com/pglease/pglease => ../
