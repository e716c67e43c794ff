module github.com/baton-lock/baton/clients/go

go 1.22
