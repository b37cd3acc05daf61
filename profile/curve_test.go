package profile

import (
	"bytes"
	"encoding/xml"
	"strings"
	"testing"
)

func TestCurveSVG(t *testing.T) {
	var b bytes.Buffer
	series := []Series{
		{Name: "training loss", Color: "blue", X: []float64{1, 2, 3, 4}, Y: []float64{5.5, 4, 3.2, 3}},
		{Name: "evaluation <loss>", Color: "red", X: []float64{2, 4}, Y: []float64{4.1, 3.3}, Dots: true},
	}
	if err := WriteCurveSVG(&b, "Loss", "step", "nats", series); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Polylines []struct {
			Points string `xml:"points,attr"`
		} `xml:"polyline"`
		Circles []struct{} `xml:"circle"`
		Texts   []string   `xml:"text"`
	}
	if err := xml.Unmarshal(b.Bytes(), &doc); err != nil {
		t.Fatalf("not well-formed SVG: %v\n%s", err, b.String())
	}
	if len(doc.Polylines) != 2 || len(doc.Circles) != 2 {
		t.Fatalf("%d lines and %d dots, want 2 and 2", len(doc.Polylines), len(doc.Circles))
	}
	if n := len(strings.Fields(doc.Polylines[0].Points)); n != 4 {
		t.Errorf("training line has %d points, want 4", n)
	}
	all := strings.Join(doc.Texts, "|")
	for _, want := range []string{"training loss", "evaluation <loss>", "Loss", "step"} {
		if !strings.Contains(all, want) {
			t.Errorf("labels %q lack %q", all, want)
		}
	}
	if err := WriteCurveSVG(&b, "", "", "", []Series{{X: []float64{1}, Y: nil}}); err == nil {
		t.Error("series with mismatched lengths accepted")
	}
	if err := WriteCurveSVG(&b, "", "", "", nil); err == nil {
		t.Error("empty plot accepted")
	}
}
