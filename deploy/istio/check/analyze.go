package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"istio.io/istio/istioctl/pkg/util/formatting"
	"istio.io/istio/pkg/config/analysis/analyzers"
	"istio.io/istio/pkg/config/analysis/local"
	"istio.io/istio/pkg/config/resource"
)

// analyzeFiles runs every analyzer of istioctl analyze on files, and prints
// the messages as istioctl analyze -o json does. Unlike istioctl analyze
// --use-kube=false, which ignores the Services, Pods and Namespaces in its
// files and so skips the analyzers that need them, it reads them as a live
// cluster would provide them: gateway selectors, gateway ports and route
// destinations are checked against the files' Kubernetes objects.
func analyzeFiles(files []string, stdout, stderr io.Writer) error {
	sa := local.NewIstiodAnalyzer(analyzers.AllCombined(), "", resource.Namespace("istio-system"), nil)
	var readers []local.ReaderSource
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return fmt.Errorf("open %s: %w", f, err)
		}
		defer fh.Close()
		readers = append(readers, local.ReaderSource{Name: f, Reader: fh})
	}
	// The first reader source decides which kinds files may carry: this one
	// takes Services, Pods and Namespaces too. Istio's default resources
	// (what istioctl analyze adds offline) come after, into the same source.
	if err := sa.AddTestReaderKubeSource(readers); err != nil {
		return fmt.Errorf("read files: %w", err)
	}
	if err := sa.AddDefaultResources(); err != nil {
		return fmt.Errorf("add Istio's default resources: %w", err)
	}
	result, err := sa.Analyze(make(chan struct{}))
	if err != nil {
		return fmt.Errorf("analyze: %w", err)
	}
	if len(result.SkippedAnalyzers) > 0 {
		fmt.Fprintf(stderr, "skipped analyzers (inputs absent): %s\n", strings.Join(result.SkippedAnalyzers, ", "))
	}
	out, err := formatting.Print(*result.Messages.SetDocRef("duet-istio-check"), formatting.JSONFormat, false)
	if err != nil {
		return fmt.Errorf("format messages: %w", err)
	}
	_, err = fmt.Fprintln(stdout, out)
	return err
}
