module github.com/cocoonstack/cocoon-fixup/go/cocoonfixup

go 1.19
